"""Span attribute names: the OpenTelemetry GenAI semantic conventions, plus our own `edge.*`
attributes for the simulated edge and the model replica's internals. Pure functions build the
attribute dicts, so what a span carries is testable without a tracer."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from opentelemetry.util.types import AttributeValue

# --- OpenTelemetry GenAI semantic conventions (gen_ai.*) ------------------------------------
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
GEN_AI_REQUEST_SEED = "gen_ai.request.seed"
GEN_AI_REQUEST_STREAM = "gen_ai.request.stream"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"  # seconds
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_EMBEDDINGS_DIMENSION_COUNT = "gen_ai.embeddings.dimension.count"
# General conventions used on the same spans.
ERROR_TYPE = "error.type"
HTTP_REQUEST_METHOD = "http.request.method"
HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"
URL_PATH = "url.path"

PROVIDER_NAME = "ray_edge_ai"  # gen_ai.provider.name: ours is not one of the well-known values
# gen_ai.operation.name per task: `chat` and `embeddings` are well-known values; moderation is not.
OPERATION_BY_TASK: Mapping[str, str] = {
    "chat": "chat",
    "embedding": "embeddings",
    "moderation": "moderation",
}

# --- the simulated edge (router span) --------------------------------------------------------
EDGE_REQUEST_ID = "edge.request_id"
EDGE_COLO = "edge.colo"
EDGE_REGION = "edge.region"  # the region that served it
EDGE_RTT_MS = "edge.rtt_ms"
EDGE_ROUTE_REASON = "edge.route_reason"
EDGE_FAILOVER = "edge.failover"  # bool: another colo failed first
EDGE_TRIED_COLOS = "edge.tried_colos"  # drilled colos passed, then regions; the last answered
EDGE_CACHE = "edge.cache"  # HIT / JOINED / MISS; absent when the request was not cacheable
EDGE_COLD_START = "edge.cold_start"  # bool
EDGE_COLD_START_MS = "edge.cold_start_ms"
EDGE_CLIENT_COUNTRY = "edge.client.country"
EDGE_CLIENT_LAT = "edge.client.lat"
EDGE_CLIENT_LON = "edge.client.lon"
EDGE_CLIENT_LOCATION_SOURCE = "edge.client.location_source"
EDGE_CANCELLED = "edge.cancelled"  # the client left before the end

# --- inside the model replica (model span) ---------------------------------------------------
EDGE_MODEL_QUEUE_WAIT_MS = "edge.model.queue_wait_ms"
EDGE_MODEL_BATCH_SIZE = "edge.model.batch_size"  # the largest batch this request ran in
EDGE_MODEL_PREFILL_MS = "edge.model.prefill_ms"
EDGE_MODEL_DECODE_MS = "edge.model.decode_ms"
EDGE_MODEL_DECODE_STEPS = "edge.model.decode_steps"
EDGE_MODEL_FORWARD_MS = "edge.model.forward_ms"  # embedding / moderation forward pass

# --- resource (every span of a process) ------------------------------------------------------
EDGE_PROCESS_ROLE = "edge.process_role"

# Client coordinates are rounded to about 10 km: enough to explain a route, not to find a person.
CLIENT_COORDINATE_DECIMALS = 1


class RouteDecision(Protocol):
    """Where a request went (deployments.ingress.edge.EdgeTrace has this shape)."""

    colo: str
    region: str
    rtt_ms: float
    reason: str
    tried: list[str]
    cold_start_ms: float | None
    cache: str | None
    skipped_colos: tuple[str, ...]
    failed_regions: tuple[str, ...]

    @property
    def cold_start_phases(self) -> Mapping[str, float | None] | None:
        """Seconds per start phase of the replica the request waited on (None: no cold start)."""


class ClientPlace(Protocol):
    """Where the client is (edge_sim.geo.ClientLocation has this shape). Read-only members, so
    a frozen dataclass with narrower types (a Literal source) matches."""

    @property
    def lat(self) -> float: ...
    @property
    def lon(self) -> float: ...
    @property
    def source(self) -> str: ...
    @property
    def country(self) -> str | None: ...


def span_name(operation: str, model: str) -> str:
    """The GenAI convention's span name: `{gen_ai.operation.name} {gen_ai.request.model}`."""
    return f"{operation} {model}"


def _present(attributes: Mapping[str, Any]) -> dict[str, AttributeValue]:
    # OpenTelemetry rejects None values (with a warning per attribute): leave them out.
    return {key: value for key, value in attributes.items() if value is not None}


def request_attributes(
    operation: str,
    model: str,
    *,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stream: bool | None = None,
) -> dict[str, AttributeValue]:
    return _present(
        {
            GEN_AI_OPERATION_NAME: operation,
            GEN_AI_PROVIDER_NAME: PROVIDER_NAME,
            GEN_AI_REQUEST_MODEL: model,
            GEN_AI_REQUEST_MAX_TOKENS: max_tokens,
            GEN_AI_REQUEST_TEMPERATURE: temperature,
            GEN_AI_REQUEST_TOP_P: top_p,
            GEN_AI_REQUEST_SEED: seed,
            GEN_AI_REQUEST_STREAM: stream,
        }
    )


def usage_attributes(
    *,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    finish_reasons: Iterable[str] = (),
    response_model: str | None = None,
) -> dict[str, AttributeValue]:
    reasons = [str(reason) for reason in finish_reasons]
    return _present(
        {
            GEN_AI_USAGE_INPUT_TOKENS: input_tokens,
            GEN_AI_USAGE_OUTPUT_TOKENS: output_tokens,
            GEN_AI_RESPONSE_FINISH_REASONS: reasons or None,
            GEN_AI_RESPONSE_MODEL: response_model,
        }
    )


def route_attributes(
    route: RouteDecision, client: ClientPlace | None = None
) -> dict[str, AttributeValue]:
    attributes: dict[str, Any] = {
        EDGE_COLO: route.colo,
        EDGE_REGION: route.region,
        EDGE_RTT_MS: round(route.rtt_ms, 3),
        EDGE_ROUTE_REASON: route.reason,
        EDGE_FAILOVER: route.reason == "failover",
        EDGE_TRIED_COLOS: list(route.tried) or None,
        EDGE_CACHE: route.cache,
        EDGE_COLD_START: route.cold_start_ms is not None,
        EDGE_COLD_START_MS: route.cold_start_ms,
    }
    if client is not None:
        attributes[EDGE_CLIENT_COUNTRY] = client.country
        attributes[EDGE_CLIENT_LAT] = round(client.lat, CLIENT_COORDINATE_DECIMALS)
        attributes[EDGE_CLIENT_LON] = round(client.lon, CLIENT_COORDINATE_DECIMALS)
        attributes[EDGE_CLIENT_LOCATION_SOURCE] = str(client.source)
    return _present(attributes)
