"""The Ray Serve model deployments: one replica class per task, sharing `ModelServer`."""
