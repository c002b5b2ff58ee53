"""ray-edge-ai serving layer: model runtimes, Ray Serve deployments and the export pipeline."""
