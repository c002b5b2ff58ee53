"""A module path from before the folders followed the processes fails with the new path in its
message: a serve_config.yaml that still names `deployments.autoscale:ByHeldRequests` says where
the policy went, as Serve's controller would import it."""

from __future__ import annotations

import importlib
import re

import pytest

from deployments.moved import MOVED, new_path


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("deployments.autoscale", "deployments.control.autoscale"),
        ("deployments.keep_warm", "deployments.control.keep_warm"),
        ("deployments.servers.chat", "deployments.replica.chat"),
        ("deployments.runtime.llm", "deployments.replica.engine.llm"),
        # the most specific entry wins: wire types went to the contracts, not the engine
        ("deployments.runtime.outputs", "deployments.contracts.outputs"),
        ("deployments.servers.session_router", "deployments.contracts.session_router"),
        ("deployments.security.config", "deployments.config.security"),
        ("deployments.api.openai", "deployments.ingress.api.openai"),
    ],
)
def test_an_old_path_names_the_new_one(old: str, new: str) -> None:
    assert new_path(old) == new
    # Python imports the parents first: the first one that moved is the one the error names
    parts = old.split(".")
    first_moved = next(
        ".".join(parts[:n]) for n in range(2, len(parts) + 1) if ".".join(parts[:n]) in MOVED
    )
    expected = f"{first_moved} moved to {new_path(first_moved)} "
    with pytest.raises(ModuleNotFoundError, match=re.escape(expected)):
        importlib.import_module(old)
    importlib.import_module(new)  # and the new path is real


def test_every_new_path_exists() -> None:
    for new in MOVED.values():
        importlib.import_module(new)


def test_a_path_that_never_existed_is_a_plain_miss() -> None:
    assert new_path("deployments.no_such_module") is None
    with pytest.raises(ModuleNotFoundError) as missing:
        importlib.import_module("deployments.no_such_module")
    assert "moved" not in str(missing.value)


def test_the_autoscaling_policy_as_serve_imports_it() -> None:
    """Serve's controller resolves `policy_function` with Ray's import_attr."""
    from ray._common.utils import import_attr

    with pytest.raises(ModuleNotFoundError, match="deployments.control.autoscale"):
        import_attr("deployments.autoscale:ByHeldRequests")
    assert import_attr("deployments.control.autoscale:ByHeldRequests").__name__ == "ByHeldRequests"
