"""Module paths from before the folders followed the processes (wave 4). A config or script that
still names one (a `policy_function: deployments.autoscale:ByHeldRequests` in serve_config.yaml,
say) fails at import with a message naming the new path, instead of a bare ModuleNotFoundError."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

MOVED: dict[str, str] = {
    "deployments.autoscale": "deployments.control.autoscale",
    "deployments.keep_warm": "deployments.control.keep_warm",
    "deployments.prewarm": "deployments.control.prewarm",
    "deployments.warm_pool": "deployments.control.warm_pool",
    "deployments.edge_control": "deployments.control.edge_control",
    "deployments.router": "deployments.ingress.router",
    "deployments.api": "deployments.ingress.api",
    "deployments.serving": "deployments.ingress.serving",
    "deployments.edge": "deployments.ingress.edge",
    "deployments.cache": "deployments.ingress.cache",
    "deployments.security": "deployments.ingress.security",
    "deployments.state": "deployments.ingress.state",
    "deployments.dashboard": "deployments.ingress.dashboard",
    "deployments.protocol": "deployments.ingress.protocol",
    "deployments.servers": "deployments.replica",
    "deployments.servers.session_router": "deployments.contracts.session_router",
    "deployments.security.config": "deployments.config.security",
    "deployments.state.config": "deployments.config.state",
    "deployments.runtime": "deployments.replica.engine",
    **{
        f"deployments.runtime.{wire}": f"deployments.contracts.{wire}"
        for wire in (
            "outputs",
            "encoder_outputs",
            "sampling_params",
            "chat_features",
            "session_config",
            "manifest",
        )
    },
}


def new_path(name: str) -> str | None:
    """Where a pre-move module (or one inside a moved package) lives now, if it moved."""
    for old in sorted(MOVED, key=len, reverse=True):  # the most specific first
        new = MOVED[old]
        if name == old or name.startswith(old + "."):
            return new if name == old else f"{new}{name[len(old) :]}"
    return None


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Last on `sys.meta_path`: asked only for a module no other finder found."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        moved = new_path(fullname)
        if moved is not None:
            raise ModuleNotFoundError(
                f"{fullname} moved to {moved} (docs/architecture.md, the process map)",
                name=fullname,
            )
        return None


def install() -> None:
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
