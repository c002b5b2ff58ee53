"""Config errors with one line per problem (e.g. `colos[3].lat: must be ...`), and YAML loading."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import AfterValidator, ValidationError
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


Latitude = Annotated[float, AfterValidator(lambda value: in_range(value, -90, 90))]
Longitude = Annotated[float, AfterValidator(lambda value: in_range(value, -180, 180))]


def load_yaml_mapping(path: Path, what: str, *, empty_ok: bool = False) -> dict[str, Any]:
    """A YAML file's top-level mapping, or EdgeConfigError naming the file and the problem."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EdgeConfigError(f"{what} file not found: {path}") from None
    except yaml.YAMLError as error:
        raise EdgeConfigError(f"{path}: not valid YAML: {error}") from None
    if data is None and empty_ok:
        return {}
    if not isinstance(data, dict):
        raise EdgeConfigError(f"{path}: expected a mapping at the top level")
    return data
