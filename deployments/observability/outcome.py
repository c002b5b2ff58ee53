"""What happened to one request, as the router saw it: the single input of its metrics and its
access-log line, so the two can never disagree."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from deployments.errors import ServingError

CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client went away first"


def error_status(error: BaseException) -> int:
    """The HTTP status an error stands for."""
    if isinstance(error, ServingError):
        return error.status
    if isinstance(error, asyncio.CancelledError):
        return CLIENT_CLOSED_REQUEST
    return 500


@dataclass(frozen=True)
class RequestOutcome:
    endpoint: str  # the URL path
    model: str | None  # as the client named it; None when it named none
    status: int  # HTTP status sent
    latency_s: float  # arrival -> last byte sent
    stream: bool = False
    colo: str | None = None  # the entry colo (None: never routed)
    region: str | None = None  # the region that served it (None: never routed)
    route_reason: str | None = None
    tried: tuple[str, ...] = ()  # drilled colos passed, then regions tried; the last answered
    skipped_colos: tuple[str, ...] = ()  # entry colos whose drill failed the request
    failed_regions: tuple[str, ...] = ()  # regions that failed it before one answered
    cold_start_ms: float | None = None
    cache: str | None = None  # HIT / MISS; None when not cacheable
    ttft_s: float | None = None  # streams: arrival -> first token sent
    input_tokens: int | None = None
    output_tokens: int | None = None
    finish_reason: str | None = None
    flagged_categories: tuple[str, ...] = ()  # moderation categories flagged, over all inputs
    error_type: str | None = None
    key_id: str | None = None  # the authenticated key's id; None before authentication
    operation: str | None = None  # gen_ai.operation.name; None for a request of no model
    cold_start_phases: tuple[tuple[str, float], ...] = ()  # (phase, seconds) of the replica start
    overhead_ms: float | None = None  # x-edge-overhead-ms as sent; None: no model was called

    @property
    def failover(self) -> bool:
        return self.route_reason == "failover"
