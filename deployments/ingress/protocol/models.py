"""`GET /v1/models`: OpenAI's model list, extended with each model's task and family."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from deployments.ingress.protocol.common import ResponseModel

OWNED_BY = "ray-edge-ai"

Task = Literal["chat", "embedding", "moderation"]


class ModelCard(ResponseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = OWNED_BY
    task: Task = Field(description="Extension: which endpoint serves this model.")
    family: str | None = Field(default=None, description="Extension: the model family.")
    aliases: list[str] = Field(
        default_factory=list, description="Extension: other names this model answers to."
    )
    categories: list[str] | None = Field(
        default=None,
        description="Extension (moderation): the categories the model really judges; OpenAI's "
        "others are always false / 0.0.",
    )


class ModelList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
