"""The served models, looked up by name and task (their handles, one per region, are the
edge's: deployments.ingress.edge.pools.RegionPools)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from deployments.errors import ModelNotFoundError, WrongTaskError
from deployments.ingress.protocol import ModelCard, ModelList
from deployments.ingress.protocol.models import Task
from deployments.ingress.protocol.workers_ai import WorkersModel


@dataclass(frozen=True)
class ServedModel:
    name: str
    task: Task
    family: str
    aliases: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()  # moderation: what it judges
    description: str = ""


@dataclass(frozen=True)
class DeploymentState:
    """A model deployment as Ray Serve reports it, for /readyz and the dashboard."""

    status: str
    running_replicas: int
    replica_states: Mapping[str, int] = field(default_factory=dict)  # Serve's, by state name


# Ray Serve's view of the model deployments, by name (the ingress asks `serve.status()`).
DeploymentStates = Callable[[], Awaitable[Mapping[str, DeploymentState]]]


class ModelCatalogue:
    def __init__(
        self,
        models: Mapping[str, ServedModel],
        created: int,
        deployments: Mapping[str, Mapping[str, str]] | None = None,
    ):
        """`deployments`: model -> region -> Serve deployment name (default: the model's own)."""
        self.models = dict(models)
        self.created = created
        self.deployments = {
            name: dict((deployments or {}).get(name) or {"default": name}) for name in self.models
        }
        # every name a model answers to (its own and its aliases) -> the model's own name
        self.names = {name: name for name in self.models}
        self.names.update(
            {alias: name for name, model in self.models.items() for alias in model.aliases}
        )

    def get(self, name: str, task: Task | None = None) -> ServedModel:
        """The model `name` (or alias); 404 if unknown, 400 if `task` is given and it serves
        another."""
        model = self.models.get(self.names.get(name, ""))
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

    def card(self, name: str) -> ModelCard:
        """`GET /v1/models/{id}`: the card of a model (asked by its name or an alias)."""
        model = self.get(name)
        return ModelCard(
            id=model.name,
            created=self.created,
            task=model.task,
            family=model.family,
            aliases=list(model.aliases),
            categories=list(model.categories) if model.task == "moderation" else None,
        )

    def workers_models(self, search: str | None = None, task: str | None = None) -> list[Any]:
        """Every name a client may call (aliases first), in Workers AI's catalogue shape,
        filtered like `.../ai/models/search` (`search` in the name or description, `task` by
        Workers AI's task name)."""
        entries = []
        for model in self.models.values():
            for name in (*model.aliases, model.name):
                entry = WorkersModel.of(
                    name, model.name, model.task, model.family, model.description
                )
                text = f"{entry.name} {entry.description}".lower()
                if search and search.lower() not in text:
                    continue
                if task and task.lower() != entry.task.name.lower():
                    continue
                entries.append(entry)
        return entries

    def cards(self) -> ModelList:
        return ModelList(data=[self.card(name) for name in self.models])

    def readiness(
        self,
        states: Mapping[str, DeploymentState],
        last_cold_start: Mapping[str, Any],
    ) -> dict[str, Any]:
        """/readyz: each model's replicas per region and last cold start; `ready` lists the
        models with a running replica in some region."""
        models: dict[str, dict[str, Any]] = {}
        for name, by_region in self.deployments.items():
            regions = {
                region: {
                    "status": states[deployment].status,
                    "running_replicas": states[deployment].running_replicas,
                }
                for region, deployment in by_region.items()
            }
            models[name] = {
                "running_replicas": sum(r["running_replicas"] for r in regions.values()),
                "regions": regions,
                "last_cold_start": last_cold_start.get(name),
            }
        ready = [name for name, model in models.items() if model["running_replicas"] > 0]
        return {"ready": ready, "models": models}
