"""Ray's private API is touched in deployments/ray_ext only: no other module of ours imports a
private Ray module or name, names one in a string, or reaches for Serve's controller handle."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from deployments.config import PROJECT_ROOT

PACKAGES = ("deployments", "edge_sim", "edgectl", "benchmarks")
ALLOWED = PROJECT_ROOT / "deployments" / "ray_ext"
PRIVATE_MODULE = re.compile(r"^ray(\.[A-Za-z0-9]\w*)*\._\w+")  # ray._raylet, ray.serve._private...
PRIVATE_NAMES = {"_get_global_client", "_controller"}


def private_touches(source: str) -> Iterator[str]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            if PRIVATE_MODULE.match(node.module):
                yield f"from {node.module} import ..."
            yield from (f"import {a.name}" for a in node.names if a.name in PRIVATE_NAMES)
        elif isinstance(node, ast.Import):
            yield from (f"import {a.name}" for a in node.names if PRIVATE_MODULE.match(a.name))
        elif isinstance(node, ast.Attribute) and node.attr in PRIVATE_NAMES:
            yield f".{node.attr}"
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and PRIVATE_MODULE.match(node.value)
        ):
            yield repr(node.value)


def test_private_ray_is_touched_only_in_ray_ext():
    found = {}
    for package in PACKAGES:
        for path in sorted((PROJECT_ROOT / package).rglob("*.py")):
            if ALLOWED in path.parents:
                continue
            touches = sorted(set(private_touches(path.read_text())))
            if touches:
                found[str(path.relative_to(PROJECT_ROOT))] = touches
    assert found == {}, f"move these into deployments/ray_ext (with a canary test): {found}"


def test_the_check_sees_each_kind_of_touch():
    source = """
from ray._raylet import Config
import ray._private.services
from ray.serve.context import _get_global_client
client._controller.get_serve_instance_details.remote()
PRELOAD = ("ray.serve._private.replica",)
from ray.serve.schema import ServeStatus
"""
    assert sorted(set(private_touches(source))) == [
        "'ray.serve._private.replica'",
        "._controller",
        "from ray._raylet import ...",
        "import _get_global_client",
        "import ray._private.services",
    ]
