"""ray-edge-ai serving layer: model runtimes, Ray Serve deployments and the export pipeline."""

from deployments import moved

moved.install()
