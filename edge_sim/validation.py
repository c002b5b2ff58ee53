"""Turn pydantic validation errors into one line per problem, e.g. `colos[3].lat: must be ...`."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ValidationError
from pydantic_core import PydanticCustomError


class EdgeConfigError(ValueError):
    """An edge-network config (or topology file) is invalid; the message lists every problem."""


def field_path(loc: Sequence[int | str]) -> str:
    """`("topology", "colos", 3, "lat")` -> `topology.colos[3].lat`."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def describe(error: ValidationError, *, prefix: str = "") -> str:
    """One `path: message` line per problem, in pydantic's (deterministic) order."""
    lines = []
    for item in error.errors(include_url=False):
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            message = "unknown field"
        elif item["type"] == "value_error":
            # pydantic prefixes messages of plain ValueErrors; the path already says where.
            message = message.removeprefix("Value error, ")
        where = field_path(item["loc"])
        # Whole-object checks (e.g. duplicate ids) name their own path inside the message.
        lines.append(f"{prefix}{where}: {message}" if where else f"{prefix}{message}")
    return "\n".join(lines)


def in_range(value: float, low: float, high: float) -> float:
    """For field validators: `must be between -90 and 90, got 91` (no pydantic prefix)."""
    if not low <= value <= high:
        raise PydanticCustomError("range", f"must be between {low:g} and {high:g}, got {value:g}")
    return value
