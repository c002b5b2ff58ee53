"""What a service knows of the HTTP request it serves: plain values, picklable, built once per
request by the API layer (a Starlette request cannot cross a Ray call; services never see one)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from deployments.edge.waiting import WaitLimits
from deployments.security import Principal
from edge_sim.geo import COUNTRY_HEADER, GEO_HEADER

# The request headers the edge locates a client by; the rest of the request stays in the API layer.
LOCATION_HEADERS = (GEO_HEADER, COUNTRY_HEADER)


@dataclass(frozen=True)
class RequestContext:
    principal: Principal
    request_id: str | None = None
    traceparent: str | None = None  # the router span's, for the model call's child span
    client_ip: str | None = None
    location_headers: Mapping[str, str] = field(default_factory=dict)
    cache_bypass: bool = False  # the client asked not to be served from (or into) the cache
    wait_limits: WaitLimits = field(default_factory=WaitLimits)

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
