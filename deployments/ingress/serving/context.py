"""What a service knows of the HTTP request it serves: plain values, picklable, built once per
request by the API layer (a Starlette request cannot cross a Ray call; services never see one)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from deployments.errors import BadHeaderValueError
from deployments.ingress.edge.waiting import WaitLimits
from deployments.ingress.security import Principal
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

    @property
    def key_id(self) -> str:
        return self.principal.key_id

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
