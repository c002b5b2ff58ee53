"""The serve config the gateway suite runs: the at-rest suite's copy of serve_config.yaml (our
models/, its own state folder and ports, HAProxy in front as shipped), with one model's downscale
delays cut so it reaches zero between tries, and two API keys, as an operator sets them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.atrest import serve_files
from benchmarks.atrest.serve_files import set_model_idle_delay

# Key A floods the chat model, key B is the light user beside it; both without rate limits (as
# an operator gives a load generator), so a 429 is the gateway's capacity answer, never a limit.
FLOOD_KEY_ID, FLOOD_KEY = "flood", "sk-gateway-flood-0001"
LIGHT_KEY_ID, LIGHT_KEY = "light", "sk-gateway-light-0002"
UNLIMITED = {"requests_per_minute": None, "tokens_per_minute": None}


def cluster_env() -> dict[str, str]:
    """The environment Ray starts in: the API keys (docs/security.md, EDGE_API_KEYS)."""
    return {"EDGE_API_KEYS": f"{FLOOD_KEY_ID}:{FLOOD_KEY},{LIGHT_KEY_ID}:{LIGHT_KEY}"}


def gateway_config(
    shipped: Mapping[str, Any],
    models_dir: Path,
    data_dir: Path,
    http_port: int,
    listener_port: int,
    idle_model: str,
    idle_delay_s: float,
) -> dict[str, Any]:
    """The shipped config on ports and folders of its own; `idle_model`'s pools (every region's)
    back to zero `idle_delay_s` after their last request; the two keys unlimited."""
    config = serve_files.ours(shipped, models_dir, data_dir, http_port, listener_port, None)
    (app,) = config["applications"]
    set_model_idle_delay(config, idle_model, idle_delay_s)
    security = app["args"].setdefault("security", {})
    security["per_key"] = {
        **(security.get("per_key") or {}),
        FLOOD_KEY_ID: dict(UNLIMITED),
        LIGHT_KEY_ID: dict(UNLIMITED),
    }
    return config
