# ray-edge-ai on the official Ray image of the pinned Ray version (pyproject.toml: ray[serve]).
#   GPU serving image (default):  docker build -t ray-edge-ai:0.1.0-ray2.60.0-gpu .
#   CPU demo image:               docker build --target cpu -t ray-edge-ai:0.1.0-ray2.60.0-cpu .
#                                 docker run --rm -p 8000:8000 --shm-size=2g ray-edge-ai:0.1.0-ray2.60.0-cpu
# The CPU image carries the export extras and the embedded default models (baked into /models):
# it serves on its own, and it is the image of k8s/models-job.yaml. The GPU image is what the
# RayService pods run; its models come from the volume mounted at /models.
# tests/unit/test_k8s.py checks RAY_VERSION against pyproject.toml.
ARG RAY_VERSION=2.60.0

FROM rayproject/ray:${RAY_VERSION}-py311 AS cpu
WORKDIR /home/ray/ray-edge-ai
COPY --chown=ray:users pyproject.toml README.md serve_config.yaml ./
COPY --chown=ray:users deployments deployments
COPY --chown=ray:users edge_sim edge_sim
# Editable, so the project root is this directory and serve_config.yaml's relative
# `models_dir: models` is ./models, which points at the baked models.
RUN pip install --no-cache-dir -e ".[cpu,export,otel]"
USER root
RUN mkdir /models && chown ray:users /models
# Numeric (user `ray`, group `users`), so Kubernetes can check runAsNonRoot; the pods' runAsUser
# and runAsGroup are the same (deployments/k8s/pod_security.py).
USER 1000:100
RUN python -m deployments.export defaults --out /models && ln -s /models models
EXPOSE 8000
CMD ["serve", "run", "serve_config.yaml"]

# Last stage, so the default target.
FROM rayproject/ray:${RAY_VERSION}-py311-gpu AS gpu
WORKDIR /home/ray/ray-edge-ai
COPY --chown=ray:users pyproject.toml README.md ./
COPY --chown=ray:users deployments deployments
COPY --chown=ray:users edge_sim edge_sim
# onnxruntime-gpu only: the export extras (torch, transformers) stay out of the serving image.
# KubeRay starts Ray in these pods and submits serveConfigV2 (models_dir /models) itself.
RUN pip install --no-cache-dir ".[gpu,otel]"
USER 1000:100
