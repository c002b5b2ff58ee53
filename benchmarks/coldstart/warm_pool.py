"""An experiment, not a feature: keep idle Ray workers that already imported Ray Serve's replica
code and our modules, so a replica started from zero might take one instead of a new process.
Measured on Ray 2.60: it does not - the worker that ran the task went to none of the replicas
started after it (only never-used workers prestarted at node start were)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

import ray

# What a replica imports before its __init__ (Serve's replica machinery, then our classes).
PRELOAD = (
    "ray.serve._private.replica",
    "deployments.servers.chat",
    "deployments.servers.batched",
    "benchmarks.coldstart.empty",
)


def _preload(modules: Sequence[str]) -> int:
    for module in modules:
        importlib.import_module(module)
    return os.getpid()


def prestart_workers(
    count: int, runtime_env: Mapping[str, Any] | None, modules: Sequence[str] = PRELOAD
) -> list[int]:
    """Run `count` overlapping zero-CPU tasks that import `modules`, with the replicas'
    runtime_env (workers only serve work with the same one): afterwards their workers idle in
    Ray's pool, warm. Returns the workers' pids."""
    task = ray.remote(num_cpus=0)(_preload)
    if runtime_env:
        task = task.options(runtime_env=dict(runtime_env))
    return sorted(set(ray.get([task.remote(list(modules)) for _ in range(count)])))
