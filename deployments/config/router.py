"""The router's settings (serve_config.yaml `args.router`): its body and time limits, the
response cache and its single flight, coalescing, fair queueing between keys, its own port."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from deployments.config.strict import StrictModel
from deployments.contracts.manifest import Task

CacheBackend = Literal["sqlite", "redis", "memory"]


class SingleFlightConfig(StrictModel):
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


class CacheConfig(StrictModel):
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


class CoalesceConfig(StrictModel):
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


class FairQueueConfig(StrictModel):
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
        default=18,
        ge=1,
        le=65536,
        description="requests the routers together send to one running replica at once: the "
        "model's max_ongoing_requests (a cold model: one replica's worth, so its wake goes out); "
        "a key already served fills it less reserved_per_replica (the shipped 18: 16 + 2)",
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


class ListenerConfig(StrictModel):
    """The router replicas' own HTTP port (deployments/ingress/api/listener.py), off by default:
    the shipped front is HAProxy on http_options.port (docs/operating.md, "The front door"); this
    port has no health check and no retry, and the benchmarks compare it with Serve's proxy."""

    enabled: bool = False
    host: str = Field(default="0.0.0.0", min_length=1)
    port: int = Field(default=8080, ge=1, le=65535)


class RouterConfig(StrictModel):
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
