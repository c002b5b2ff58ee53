"""The control plane: edge-control (shared edge state and drills), the warm worker pool, and the
policies Serve's controller runs (autoscaling, keep-warm, pre-warming)."""
