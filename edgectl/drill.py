"""`edge drill down|latency|errors|clear <colo-or-region>`: fault drills through the router's admin
API. A region stands for every colo the router places in it; a timed fault clears itself."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from edge_sim.faults import ColoFault

HTTP_TIMEOUT_S = 10.0
DURATION_UNITS_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


class DrillError(Exception):
    """The drill could not be applied; the message says why (exit 1)."""


class UnknownTargetError(DrillError):
    """Neither a colo id nor a region the router knows (a usage mistake: exit 2)."""


def parse_duration_s(text: str) -> float:
    """'60', '60s', '2m', '1.5h', '30d' -> seconds (for argparse's `type=`)."""
    match = _DURATION.match(text.lower())
    if match is None or float(match[1]) <= 0:
        raise ValueError(f"{text!r} is not a duration such as 30s, 2m or 1h")
    return float(match[1]) * DURATION_UNITS_S[match[2]]


@dataclass(frozen=True)
class DrillResult:
    colos: tuple[str, ...]
    action: str
    fault: ColoFault | None  # None: cleared


def fault_for(
    action: str, *, latency_ms: float, error_rate: float, for_s: float | None
) -> ColoFault:
    effects: dict[str, dict[str, Any]] = {
        "down": {"down": True},
        "latency": {"added_latency_ms": latency_ms},
        "errors": {"error_rate": error_rate},
    }
    return ColoFault(**effects[action], duration_s=for_s)


def resolve_targets(target: str, colos: Sequence[Mapping[str, Any]]) -> list[str]:
    """A colo id (any case) is itself; a region is its colos; anything else is a usage error."""
    by_id = {str(c.get("id", "")).upper(): str(c["id"]) for c in colos if c.get("id")}
    if target.upper() in by_id:
        return [by_id[target.upper()]]
    in_region = [str(c["id"]) for c in colos if str(c.get("region", "")).lower() == target.lower()]
    if in_region:
        return in_region
    regions = sorted({str(c["region"]) for c in colos if c.get("region")})
    known = f"colos {', '.join(sorted(by_id.values()))}"
    if regions:
        known += f"; regions {', '.join(regions)}"
    raise UnknownTargetError(f"no colo or region {target!r} at this router ({known})")


def run_drill(
    client: httpx.Client, action: str, target: str, fault: ColoFault | None
) -> DrillResult:
    """Apply `fault` (or clear, when None) at every colo `target` names."""
    colos = _admin(client, "GET", "/admin/colos")
    colo_ids = resolve_targets(target, colos if isinstance(colos, list) else colos["colos"])
    for colo_id in colo_ids:
        if fault is None:
            _admin(client, "DELETE", f"/admin/colos/{colo_id}/faults")
        else:
            body = fault.model_dump(mode="json", exclude_defaults=True)
            _admin(client, "POST", f"/admin/colos/{colo_id}/faults", json=body)
    return DrillResult(tuple(colo_ids), action, fault)


def _admin(client: httpx.Client, method: str, path: str, **kwargs: Any) -> Any:
    try:
        response = client.request(method, path, **kwargs)
    except httpx.HTTPError as error:
        raise DrillError(f"{method} {path}: {error}") from None
    if response.status_code in (401, 403):
        raise DrillError(f"{method} {path}: the router refused the admin key (set EDGE_ADMIN_KEY)")
    if response.status_code >= 400:
        raise DrillError(f"{method} {path}: HTTP {response.status_code} {response.text[:300]}")
    return response.json()


def describe(result: DrillResult) -> str:
    where = ", ".join(result.colos)
    if result.fault is None:
        return f"cleared every fault at {where}"
    fault = result.fault
    effect = (
        "down"
        if fault.down
        else f"+{fault.added_latency_ms:g} ms"
        if fault.added_latency_ms
        else f"{fault.error_rate:.0%} errors"
    )
    until = f" for {fault.duration_s:g} s (clears itself)" if fault.duration_s else " until cleared"
    return f"{where}: {effect}{until}"
