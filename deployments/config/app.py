"""The application's own settings (the `args:` of serve_config.yaml), validated once at build time.

Ray Serve's per-deployment options (autoscaling, max_ongoing_requests, user_config) stay in the
file's `deployments:` section, where ops edit them; this covers what Ray Serve has no field for.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from deployments.config.front_spare import FrontSpareConfig
from deployments.config.router import RouterConfig
from deployments.config.security import SecurityConfig
from deployments.config.state import StateConfig
from deployments.config.strict import StrictModel
from deployments.config.warm_pool import WarmPoolConfig
from deployments.contracts.manifest import Task
from deployments.observability.config import ObservabilityConfig
from deployments.paths import PROJECT_ROOT
from edge_sim.config import EdgeConfig
from edge_sim.regions import deployment_name

Accelerator = Literal["auto", "cpu", "gpu"]
# build_app's own deployments, besides one per model and region (deployments.app).
APP_DEPLOYMENTS = ("router", "edge-control", "warm-pool", "front-spare")


def serve_switches(serve_config: Mapping[str, Any]) -> dict[str, str]:
    """The Ray Serve switches a serve config file sets: its `controller_options`' environment
    (docs/performance.md, "Ray Serve's switches"). Serve reads them where each process starts;
    the controller's processes (proxies, the application's build task, replicas) inherit them, so
    `serve run`/`serve deploy` apply them on a cluster started from a plain shell. The k8s render
    also gives them to every container, for a Serve that KubeRay starts."""
    options = serve_config.get("controller_options") or {}
    env_vars = (options.get("runtime_env") or {}).get("env_vars") or {}
    return {str(name): str(value) for name, value in env_vars.items()}


MIB = 1 << 20


class ModelConfig(StrictModel):
    """One served model: where its directory is and what share of a node a replica takes."""

    task: Task
    family: str = Field(min_length=1)
    model_dir: str = Field(min_length=1, description="absolute, or relative to models_dir")
    num_cpus: float = Field(default=0.25, gt=0, le=64)
    num_gpus: float = Field(default=0.25, gt=0, le=8, description="used when accelerator is gpu")
    intra_op_threads: int = Field(default=1, ge=0, le=64, description="ONNX Runtime threads")
    aliases: tuple[str, ...] = Field(
        default=(),
        description="other names clients may use, e.g. Workers AI catalogue names (@cf/...)",
    )
    categories: tuple[str, ...] = Field(
        default=(), description="moderation: the categories the model really judges"
    )
    description: str = Field(default="", description="shown by GET .../ai/models/search")
    attempt_timeout_s: float | None = Field(
        default=None,
        gt=0,
        le=3600,
        description=(
            "a warm region that has not answered in this long fails the attempt over to the"
            " next region (Envoy's per_try_timeout); null: each attempt its share of the"
            " router's request_timeout_s. A cold region's attempt waits for its replica"
        ),
    )


class BatchingConfig(StrictModel):
    """A model deployment's `user_config`: applied live by `serve deploy`, no replica restart."""

    max_batch_size: int = Field(default=8, ge=1, le=256)
    batch_wait_timeout_s: float = Field(default=0.005, ge=0, le=1)
    # The chat runtime's own default (prefix_cache.DEFAULT_MAX_BYTES, pinned equal by a test): the
    # router reads this module and must not load the engine's.
    prefix_cache_mb: float = Field(
        default=64,
        ge=0,
        le=1_048_576,
        description="chat: recent prompts' KV caches, reused by prompts that start the same way "
        "(a system prompt, earlier turns); 0: off",
    )
    # The engine's own default (step_runner.DEFAULT_PREFILL_CHUNK_TOKENS, pinned by a test).
    prefill_chunk_tokens: int = Field(
        default=256,
        ge=16,
        le=65_536,
        description="chat: a long prompt is prefilled this many tokens at a time, the running "
        "streams taking a decode step between two: smaller, shorter gaps in their streams; "
        "larger, the long prompt's first token sooner",
    )
    # The engine's own default (step_runner.DEFAULT_PREFILL_STEP_SHARE, pinned by a test).
    prefill_step_share: float | None = Field(
        default=None,
        gt=0,
        le=100,
        description="chat: while other streams decode, each chunk of a long prompt takes at "
        "most this share of their decode step's time (measured), so their gaps stay within "
        "about 1 + share steps, and the long prompt's first token comes later (small chunks "
        "each read the weights); null: chunks of prefill_chunk_tokens",
    )
    kv_budget_mb: float | None = Field(
        default=None,
        gt=0,
        le=1_048_576,
        description="chat: MiB of KV cache a replica may hold (its prefix cache's included); "
        "requests wait for it or get 503 + Retry-After, running ones are preempted and resumed. "
        "Checked by the replica against its host's memory and one whole context. Unset: no limit",
    )


class AppConfig(StrictModel):
    accelerator: Accelerator = "auto"
    models_dir: str = "models"
    # Where the gateway keeps state that outlives a process (its SQLite files by default);
    # relative: under the project root, like models_dir.
    data_dir: str = Field(default="data", min_length=1)
    models: dict[str, ModelConfig]
    router: RouterConfig = RouterConfig()
    edge: EdgeConfig = Field(default_factory=EdgeConfig)
    security: SecurityConfig = SecurityConfig()
    observability: ObservabilityConfig = ObservabilityConfig()
    warm_pool: WarmPoolConfig = WarmPoolConfig()
    front_spare: FrontSpareConfig = FrontSpareConfig()
    state: StateConfig = StateConfig()

    @model_validator(mode="after")
    def _gate_names_served_models(self) -> AppConfig:
        gate = self.security.moderation_gate
        for name in gate.models:
            if self.models.get(name) is None or self.models[name].task != "chat":
                raise ValueError(f"security.moderation_gate.models: {name!r} is not a chat model")
        if gate.models and getattr(self.models.get(gate.moderation_model), "task", None) != (
            "moderation"
        ):
            raise ValueError(
                f"security.moderation_gate.moderation_model: {gate.moderation_model!r} "
                "is not a moderation model"
            )
        return self

    @model_validator(mode="after")
    def _attempts_end_before_the_request(self) -> AppConfig:
        for name, model in self.models.items():
            if (limit := model.attempt_timeout_s) is not None and (
                limit >= self.router.request_timeout_s
            ):
                raise ValueError(
                    f"models.{name}.attempt_timeout_s ({limit:g}) is not below "
                    f"router.request_timeout_s ({self.router.request_timeout_s:g}): "
                    "it would never end an attempt"
                )
        return self

    @model_validator(mode="after")
    def _aliases_are_unambiguous(self) -> AppConfig:
        owner: dict[str, str] = {name: name for name in self.models}
        for name, model in self.models.items():
            for alias in model.aliases:
                if not alias.strip() or alias != alias.strip():
                    raise ValueError(f"models.{name}.aliases: {alias!r} is blank or padded")
                if alias in owner:
                    raise ValueError(
                        f"models.{name}.aliases: {alias!r} already names {owner[alias]!r}"
                    )
                owner[alias] = name
        return self

    @model_validator(mode="after")
    def _prices_name_served_models(self) -> AppConfig:
        unknown = sorted(set(self.observability.prices) - set(self.models))
        if unknown:
            raise ValueError(f"observability.prices: {unknown} are not served models")
        return self

    @model_validator(mode="after")
    def _prewarm_names_served_models(self) -> AppConfig:
        unknown = sorted(set(self.edge.prewarm.models or ()) - set(self.models))
        if unknown:
            raise ValueError(f"edge.prewarm.models: {unknown} are not served models")
        return self

    @field_validator("models")
    @classmethod
    def _names_are_deployment_names(cls, models: dict[str, ModelConfig]) -> dict[str, ModelConfig]:
        if not models:
            raise ValueError("at least one model must be served")
        for name in models:
            if name in APP_DEPLOYMENTS:
                raise ValueError(f"{name!r} is reserved for one of the app's own deployments")
            if not name.replace("-", "").replace("_", "").isalnum():
                raise ValueError(f"model name {name!r} must be alphanumeric (- and _ allowed)")
        return models

    def model_deployments(self) -> dict[str, tuple[str, str]]:
        """Every model deployment build_app makes: name -> (model, region)."""
        return {
            deployment_name(model, region): (model, region)
            for model in self.models
            for region in self.edge.region_names
        }

    def data_path(self, *parts: str) -> Path:
        """A file or folder under data_dir (relative data_dir: under the project root)."""
        root = Path(self.data_dir)
        return (root if root.is_absolute() else PROJECT_ROOT / root).joinpath(*parts)

    def model_path(self, name: str) -> Path:
        """model_dir under models_dir; a relative models_dir is under the project root, so the
        app finds the models whichever directory Ray starts its processes in."""
        root = Path(self.models_dir)
        if not root.is_absolute():
            root = PROJECT_ROOT / root
        path = Path(self.models[name].model_dir)
        return path if path.is_absolute() else root / path


class ConfigError(ValueError):
    """A bad value in serve_config.yaml: the message names the field and what is allowed."""


def parse_app_config(args: dict[str, Any]) -> AppConfig:
    try:
        return AppConfig.model_validate(args)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, prefix="args")) from None


def describe_validation_error(exc: ValidationError, prefix: str) -> str:
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in (prefix, *err["loc"]))
        lines.append(f"{where}: {err['msg']}")
    return "invalid serve_config.yaml: " + "; ".join(lines)
