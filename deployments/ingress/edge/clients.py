"""The typed client of every (model, region) deployment the router calls, chosen by the model's
task: what the edge's pools hold instead of raw handles; a text model's client coalesces its
concurrent requests (deployments.ingress.edge.coalesce) when the config says so."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ray.serve.handle import DeploymentHandle

from deployments.config import AppConfig, CoalesceConfig
from deployments.contracts.chat_deployment import ChatClient
from deployments.contracts.embedding_deployment import EmbeddingClient
from deployments.contracts.model_deployment import ModelClient
from deployments.contracts.moderation_deployment import ModerationClient
from deployments.ingress.edge.coalesce import coalescer


def model_client(task: str, handle: DeploymentHandle[Any], coalesce: CoalesceConfig) -> ModelClient:
    """The client of a `task` model's deployment."""
    grouped = coalescer(coalesce) if coalesce.enabled else None
    if task == "chat":
        return ChatClient(handle)
    if task == "embedding":
        return EmbeddingClient(handle, grouped)
    if task == "moderation":
        return ModerationClient(handle, grouped)
    raise ValueError(f"no client for a {task!r} model")


def model_clients(
    config: AppConfig, handles: Mapping[str, Mapping[str, DeploymentHandle[Any]]]
) -> dict[str, dict[str, ModelClient]]:
    """`handles` (model -> region -> the handle of that model's deployment there) as clients."""
    coalesce = config.router.coalesce
    return {
        model: {
            region: model_client(config.models[model].task, handle, coalesce)
            for region, handle in by_region.items()
        }
        for model, by_region in handles.items()
    }
