"""The served models: one handle per model deployment, looked up by name and task."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from deployments.errors import ModelNotFoundError, WrongTaskError
from deployments.protocol import ModelCard, ModelList
from deployments.protocol.models import Task


@dataclass(frozen=True)
class ServedModel:
    name: str
    task: Task
    family: str
    handle: Any  # a Ray Serve DeploymentHandle; a fake in unit tests


@dataclass(frozen=True)
class DeploymentState:
    """A model deployment as Ray Serve reports it, for /readyz."""

    status: str
    running_replicas: int


# Ray Serve's view of the model deployments, by name (the ingress asks `serve.status()`).
DeploymentStates = Callable[[], Awaitable[Mapping[str, DeploymentState]]]


class ModelCatalogue:
    def __init__(self, models: Mapping[str, ServedModel], created: int):
        self.models = dict(models)
        self.created = created

    def get(self, name: str, task: Task | None = None) -> ServedModel:
        """The model `name`; 404 if unknown, 400 if `task` is given and it serves another."""
        model = self.models.get(name)
        if model is None:
            raise ModelNotFoundError(
                f"the model {name!r} does not exist; GET /v1/models lists them", param="model"
            )
        if task is not None and model.task != task:
            raise WrongTaskError(
                f"{name!r} serves the {model.task} task; this endpoint needs a {task} model",
                param="model",
            )
        return model

    def cards(self) -> ModelList:
        return ModelList(
            data=[
                ModelCard(id=m.name, created=self.created, task=m.task, family=m.family)
                for m in self.models.values()
            ]
        )

    def readiness(
        self,
        states: Mapping[str, DeploymentState],
        last_cold_start: Mapping[str, Any],
    ) -> dict[str, Any]:
        """/readyz: each model's deployment state and last cold start; `ready` lists the models
        with a running replica."""
        models = {
            name: {
                "status": states[name].status,
                "running_replicas": states[name].running_replicas,
                "last_cold_start": last_cold_start.get(name),
            }
            for name in self.models
        }
        ready = [name for name in self.models if states[name].running_replicas > 0]
        return {"ready": ready, "models": models}
