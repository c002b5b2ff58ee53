"""`edge plan`: the capacity planner's command line, its serve_config.yaml reader and report."""
