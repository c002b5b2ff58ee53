"""What a replica process imports before its __init__ runs, timed in fresh interpreters: Python
itself, Ray, Ray Serve's replica machinery, then each of our replica modules on top of that."""

from __future__ import annotations

import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from deployments.config import PROJECT_ROOT
from deployments.ray_ext.worker_setup import SERVE_REPLICA_MODULE as SERVE_REPLICA

# Each layer is timed on top of the previous ones, in a fresh interpreter each time.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ray", ()),
    (SERVE_REPLICA, ("ray",)),
)
# What a model replica deserialises (the router, always running, never cold-starts), and the
# runtime modules it cannot do without: the difference is what leaner imports would save.
REPLICA_MODULES: Mapping[str, tuple[str, ...]] = {
    "deployments.replica.chat": (
        "deployments.replica.engine.llm",
        "deployments.replica.engine.sampling",
        "deployments.replica.engine.session",
    ),
    "deployments.replica.batched": (
        "deployments.replica.engine.embedding",
        "deployments.replica.engine.moderation",
        "deployments.replica.engine.session",
    ),
}

_TIMER = """
import time
{preload}
started = time.perf_counter()
{imports}
print(time.perf_counter() - started)
"""


def _python(code: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *flags, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=PROJECT_ROOT,
        timeout=120,
    )


def import_s(modules: Sequence[str], preload: Sequence[str], repetitions: int) -> float:
    """Median seconds to import `modules` in a fresh interpreter that imported `preload` first."""
    code = _TIMER.format(
        preload="\n".join(f"import {m}" for m in preload),
        imports="\n".join(f"import {m}" for m in modules),
    )
    return statistics.median(float(_python(code).stdout.split()[-1]) for _ in range(repetitions))


def heaviest_packages(
    module: str, preload: Sequence[str], preloaded: set[str], top: int
) -> dict[str, float]:
    """`python -X importtime`: the packages `module` adds, by the summed self time of their
    modules, in ms (the modules `preload` brought are left out)."""
    code = "\n".join(f"import {m}" for m in (*preload, module))
    by_package: dict[str, int] = {}
    for line in _python(code, "-X", "importtime").stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) != 3 or not parts[0].strip().isdigit():
            continue
        name = parts[2].strip()
        if name not in preloaded:
            package = name.split(".")[0]
            by_package[package] = by_package.get(package, 0) + int(parts[0])
    ranked = sorted(by_package.items(), key=lambda row: (-row[1], row[0]))
    return {package: round(us / 1000, 1) for package, us in ranked[:top]}


def _loaded_by(modules: Sequence[str]) -> set[str]:
    code = "\n".join([*(f"import {m}" for m in modules), "import sys", "print(*sys.modules)"])
    return set(_python(code).stdout.split())


def replica_import_costs(repetitions: int, top: int = 6) -> dict[str, Any]:
    layers = {
        module: round(import_s([module], preload, repetitions), 3) for module, preload in LAYERS
    }
    on_top = ("ray", SERVE_REPLICA)
    preloaded = _loaded_by(on_top)
    ours = {}
    for module, needed in REPLICA_MODULES.items():
        whole_s = import_s([module], on_top, repetitions)
        needed_s = import_s(needed, on_top, repetitions)
        ours[module] = {
            "import_s": round(whole_s, 3),
            "runtime_modules_only_s": round(needed_s, 3),
            "avoidable_s": round(whole_s - needed_s, 3),
            "heaviest_packages_ms": heaviest_packages(module, on_top, preloaded, top),
        }
    return {
        "serve_replica_layers_s": layers,
        "ours_on_top_of_serve_s": ours,
        "note": "fresh interpreter per sample, median; each figure is on top of the ones before",
    }
