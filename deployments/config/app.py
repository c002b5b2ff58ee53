"""The application's own settings (the `args:` of serve_config.yaml), validated once at build time.

Ray Serve's per-deployment options (autoscaling, max_ongoing_requests, user_config) stay in the
file's `deployments:` section, where ops edit them; this covers what Ray Serve has no field for.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from deployments.config.security import SecurityConfig
from deployments.config.state import StateConfig
from deployments.config.warm_pool import WarmPoolConfig
from deployments.contracts.manifest import Task
from deployments.observability.config import ObservabilityConfig
from deployments.paths import PROJECT_ROOT
from edge_sim.config import EdgeConfig
from edge_sim.regions import deployment_name

Accelerator = Literal["auto", "cpu", "gpu"]
# build_app's own deployments, besides one per model and region (deployments.app).
APP_DEPLOYMENTS = ("router", "edge-control", "warm-pool")


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


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Strict):
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


class BatchingConfig(_Strict):
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
    kv_budget_mb: float | None = Field(
        default=None,
        gt=0,
        le=1_048_576,
        description="chat: MiB of KV cache a replica may hold (its prefix cache's included); "
        "requests wait for it or get 503 + Retry-After, running ones are preempted and resumed. "
        "Checked by the replica against its host's memory and one whole context. Unset: no limit",
    )


CacheBackend = Literal["sqlite", "redis", "memory"]


class SingleFlightConfig(_Strict):
    """One miss, one model call (deployments.ingress.cache.single_flight): identical cacheable
    requests that arrive while the first is being answered wait for its answer, on one router
    replica through its memory, across the replicas that share the backend through a "being
    made" mark in it (sqlite: a node's routers; redis: the cluster's)."""

    enabled: bool = True
    wait_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="the longest a request waits for an identical one's answer; past it, it "
        "calls the model itself",
    )
    mark_ttl_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="the life of the backend's mark, renewed every third of it while the answer "
        "is made: a router that dies while making an answer holds the others back no longer",
    )
    # A waiter on another replica sees the answer half a poll interval after it lands, on
    # average: at 10 ms that is ~5 ms behind the first, for one store read per 10 ms per waiting
    # replica while the answer is made (at 50 ms the waiters' p50 was 20 ms behind, live).
    poll_min_ms: float = Field(default=2.0, gt=0, le=10_000, description="another replica's mark")
    poll_max_ms: float = Field(
        default=10.0, gt=0, le=10_000, description="the poll interval doubles up to this"
    )

    @model_validator(mode="after")
    def _poll_interval_grows(self) -> SingleFlightConfig:
        if self.poll_min_ms > self.poll_max_ms:
            raise ValueError(
                f"poll_min_ms ({self.poll_min_ms:g}) is above poll_max_ms ({self.poll_max_ms:g})"
            )
        return self


class CacheConfig(_Strict):
    """Exact-match response cache for deterministic requests (embeddings, moderation, chat with
    temperature 0 or a seed), shared by the router replicas (docs/edge.md, "The response cache"):
    `sqlite`, one file under data_dir per node; `redis`, one server for the whole cluster;
    `memory`, each router replica its own."""

    enabled: bool = True
    ttl_s: float = Field(default=300.0, gt=0, le=86_400)
    max_entries: int = Field(default=10_000, ge=1, le=10_000_000)
    backend: CacheBackend = "sqlite"
    sqlite_file: str = Field(
        default="response-cache.sqlite3", min_length=1, description="under data_dir if relative"
    )
    redis_url: str | None = Field(
        default=None,
        description="redis://host:port/db without a password (EDGE_REDIS_PASSWORD gives it); "
        "EDGE_REDIS_URL, when set, replaces it",
    )
    redis_key_prefix: str = Field(default="edge:cache:", min_length=1)
    local_entries: int = Field(
        default=1000,
        ge=0,
        le=1_000_000,
        description="the in-process tier in front of a shared backend (0: none)",
    )
    timeout_ms: float = Field(
        default=100.0, gt=0, le=10_000, description="the longest a request waits on the backend"
    )
    retry_after_s: float = Field(
        default=1.0, gt=0, le=300, description="a backend that failed is not asked for this long"
    )
    single_flight: SingleFlightConfig = SingleFlightConfig()

    @field_validator("redis_url")
    @classmethod
    def _no_password_in_the_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        parsed = urlsplit(url)
        if parsed.scheme not in {"redis", "rediss", "unix"}:
            raise ValueError(f"{url!r}: redis://, rediss:// or unix:// expected")
        if parsed.password:
            raise ValueError(
                "leave the password out of the URL: the router reads it from EDGE_REDIS_PASSWORD "
                "(on Kubernetes from the ray-edge-ai-redis Secret)"
            )
        return url


class CoalesceConfig(_Strict):
    """Concurrent embedding and moderation requests to one pool, sent as one model call
    (deployments.ingress.edge.coalesce): a call leaves at once while fewer than
    `max_calls_in_flight` are out from this router replica, else waits and leaves with the others
    that queued."""

    enabled: bool = True
    max_calls_in_flight: int = Field(default=2, ge=1, le=1024, description="per pool and router")
    max_requests_per_call: int = Field(default=32, ge=1, le=1024)
    max_waiting_requests: int = Field(
        default=32,
        ge=0,
        le=65536,
        description="requests held for one pool while its calls are all out; one more meets "
        "back-pressure as at Serve's own queue (spills to another region, or 503 + Retry-After)",
    )


class FairQueueConfig(_Strict):
    """Fair queueing between keys in front of each model (deployments.ingress.edge.fair_queue):
    per model, at most `in_flight_per_replica` x its running replicas are sent at once, each
    router replica holding its share (the limit over the running routers, rounded up); past
    that, requests wait per key and are let in by weighted fair sharing
    (`security.per_key.<id>.weight`, a virtual key's `weight`), not in arrival order."""

    enabled: bool = True
    tasks: tuple[Task, ...] = Field(
        default=("chat",),
        min_length=1,
        description="the tasks whose models are gated (embeddings and moderation are coalesced)",
    )
    in_flight_per_replica: int = Field(
        default=16,
        ge=1,
        le=65536,
        description="requests the routers together send to one running replica at once: the "
        "model's max_ongoing_requests (a cold model: one replica's worth, so its wake goes out)",
    )
    reserved_per_replica: int = Field(
        default=2,
        ge=0,
        le=65535,
        description="of in_flight_per_replica, slots only a key with nothing in flight on the "
        "model may take: a key sending one request at a time gets in at once while another "
        "key's streams hold the rest (a stream holds its slot to its end)",
    )
    max_in_flight_per_key: int | None = Field(
        default=None,
        ge=1,
        le=65536,
        description="per model and router; null: up to the model's whole limit",
    )
    max_waiting: int = Field(
        default=256,
        ge=0,
        le=65536,
        description="requests held per model while it is full; one more refuses the newest "
        "waiter of the key holding the most of the queue by weight (503 queue_full + "
        "Retry-After)",
    )

    @model_validator(mode="after")
    def _reserve_leaves_room(self) -> FairQueueConfig:
        # The default yields to a small in_flight_per_replica (the gate keeps a served key one
        # slot); a reserve set on purpose that leaves none is a mistake to say.
        explicit = "reserved_per_replica" in self.model_fields_set
        if explicit and self.reserved_per_replica >= self.in_flight_per_replica:
            raise ValueError(
                f"reserved_per_replica ({self.reserved_per_replica}) must be less than "
                f"in_flight_per_replica ({self.in_flight_per_replica}): a key already served "
                "needs a slot of its own"
            )
        return self


class ListenerConfig(_Strict):
    """The router replicas' own HTTP port (deployments/ingress/api/listener.py), off by default:
    the shipped front is HAProxy on http_options.port (docs/operating.md, "The front door"); this
    port has no health check and no retry, and the benchmarks compare it with Serve's proxy."""

    enabled: bool = False
    host: str = Field(default="0.0.0.0", min_length=1)
    port: int = Field(default=8080, ge=1, le=65535)


class RouterConfig(_Strict):
    max_body_bytes: int = Field(default=1 << 20, ge=1024, le=64 << 20)
    request_timeout_s: float = Field(
        default=120.0, gt=0, le=3600, description="per request, across failovers and cold starts"
    )
    failover_attempts: int = Field(
        default=3,
        ge=1,
        le=10,
        description="region attempts per request; with fewer regions, the rest retry them in order",
    )
    default_cold_start_ms: float = Field(
        default=3000.0, ge=0, description="assumed until a cold start has been measured"
    )
    cache: CacheConfig = CacheConfig()
    coalesce: CoalesceConfig = CoalesceConfig()
    fair_queue: FairQueueConfig = FairQueueConfig()
    listener: ListenerConfig = ListenerConfig()
    num_cpus: float = Field(default=0.1, gt=0, le=64)

    @model_validator(mode="after")
    def _single_flight_waits_within_a_request(self) -> RouterConfig:
        wait_s = self.cache.single_flight.wait_s
        if wait_s > self.request_timeout_s:
            raise ValueError(
                f"cache.single_flight.wait_s ({wait_s:g}) is above request_timeout_s "
                f"({self.request_timeout_s:g}): a request would wait past its own end"
            )
        return self


class AppConfig(_Strict):
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
