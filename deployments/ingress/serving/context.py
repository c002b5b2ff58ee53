"""The request's scope: what a service knows of the HTTP request it serves (who calls, its trace,
where from, its limits) and the request's telemetry, in one object built once per request by the
API layer (`deployments.ingress.api.caller.authenticated`) or a batch item's runner. Services
never see a Starlette request; what crosses a Ray call is read off this, never this itself."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from deployments.errors import BadHeaderValueError
from deployments.ingress.edge.waiting import ColdStartNotice, WaitLimits
from deployments.ingress.security import Principal
from deployments.ingress.security.gate_failures import Direction
from deployments.observability import RequestTelemetry
from edge_sim.geo import COUNTRY_HEADER, GEO_HEADER

# The request headers the edge locates a client by; the rest of the request stays in the API layer.
LOCATION_HEADERS = (GEO_HEADER, COUNTRY_HEADER)
# Workers AI's: requests of one session go to one replica of the model's pool, whose prefix cache
# then holds the conversation so far (deployments.contracts.session_router).
SESSION_HEADER = "x-session-affinity"
MAX_SESSION_CHARS = 256


@dataclass(frozen=True)
class RequestContext:
    principal: Principal
    request_id: str | None = None
    traceparent: str | None = None  # the router span's, for the model call's child span
    client_ip: str | None = None
    location_headers: Mapping[str, str] = field(default_factory=dict)
    cache_bypass: bool = False  # the client asked not to be served from (or into) the cache
    wait_limits: WaitLimits = field(default_factory=WaitLimits)
    session: str = ""  # SESSION_HEADER's value: "" for none
    # what the request tells the metrics, the access log and the key's ledger
    telemetry: RequestTelemetry = field(default_factory=RequestTelemetry.disabled)
    # an event the edge sets when an attempt waits for a cold region's first replica: a held
    # stream (api.streaming) starts at once and says so, instead of looking hung
    warming: ColdStartNotice = field(default_factory=ColdStartNotice)
    # the moderation gate's directions that went unchecked (its classifier failed, fail_open):
    # the answer says so (x-moderation-skipped) and is not cached
    moderation_skipped: set[Direction] = field(default_factory=set)

    @property
    def key_id(self) -> str:
        return self.principal.key_id

    @property
    def key_weight(self) -> float:
        """The key's share of a full model against other keys' (the edge's fair queue)."""
        return self.principal.limits.weight

    def rejecting_if_busy(self, reject: bool) -> RequestContext:
        """This context, with Workers AI's `rejectIfBusy` (from the request body) if `reject`."""
        if not reject:
            return self
        return replace(self, wait_limits=replace(self.wait_limits, reject_if_busy=True))

    @staticmethod
    def location_of(headers: Mapping[str, str]) -> dict[str, str]:
        """The location headers present in `headers` (case-insensitive, as HTTP headers are)."""
        return {name: headers[name] for name in LOCATION_HEADERS if name in headers}


def session_of(headers: Mapping[str, str]) -> str:
    """The request's session (SESSION_HEADER), "" without one: printable ASCII, at most
    MAX_SESSION_CHARS, else a 400 naming the header."""
    session = headers.get(SESSION_HEADER, "")
    if len(session) > MAX_SESSION_CHARS or not (session.isascii() and session.isprintable()):
        raise BadHeaderValueError(
            f"expected up to {MAX_SESSION_CHARS} printable ASCII characters", header=SESSION_HEADER
        )
    return session
