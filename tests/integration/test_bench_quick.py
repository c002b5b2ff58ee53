"""Every benchmark suite that starts Ray, in its `--quick --no-peers` form, exactly as a reader
runs it: `python -m benchmarks.run --suite NAME --quick --no-peers`. Each exits 0 and prints its
JSON report with the suite's result and goals. A suite starts a Ray cluster of its own (its own
temp dir, free ports, process groups: benchmarks.lib.cluster), so it never meets the session's;
this module's name sorts it before the modules that start the session cluster, so the two never
share the machine's two cores either."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import run as bench

REPO = Path(__file__).resolve().parents[2]
# A quick suite is one Ray start plus seconds of load; on a loaded 2-core machine a start alone
# has taken minutes (benchmarks.lib.cluster retries a head that died).
SUITE_TIMEOUT_S = 900
# What a driver would attach to: never the session's cluster, or anything else on the machine.
DRIVER_ENV = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")
RAY_SUITES = sorted(name for name, module in bench.load_suites().items() if module.NEEDS_RAY)


def test_the_ray_suites_are_the_ones_the_registry_says() -> None:
    """A suite added to benchmarks.run with NEEDS_RAY joins this module by itself; this pins
    today's list so a suite that silently stops needing Ray is noticed."""
    assert RAY_SUITES == [
        "at_size",
        "atrest",
        "chat",
        "coldstart",
        "edge",
        "embeddings",
        "front_door",
        "gateway",
        "prewarm",
        "regions",
        "router",
        "router_cpu",
        "security",
    ]


def run_quick(name: str, models_root: Path, out: Path) -> tuple[int, str, dict[str, Any]]:
    env = {key: value for key, value in os.environ.items() if key not in DRIVER_ENV}
    argv = [sys.executable, "-m", "benchmarks.run", "--suite", name, "--quick", "--no-peers"]
    argv += ["--no-progress", "--models-dir", str(models_root)]
    # The at-size build (gigabytes at full width) goes in the test's temp dir, not the repo's.
    argv += ["--at-size-dir", str(out / "at-size")]
    try:
        with (out / "stderr.log").open("w") as stderr:
            done = subprocess.run(
                argv,
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                timeout=SUITE_TIMEOUT_S,
            )
    finally:
        # Kept even for a failed test is what it printed, never the gigabytes it built.
        shutil.rmtree(out / "at-size", ignore_errors=True)
    (out / "report.json").write_text(done.stdout)
    tail = (out / "stderr.log").read_text()[-4000:]
    return done.returncode, tail, json.loads(done.stdout) if done.stdout.strip() else {}


@pytest.mark.parametrize("name", RAY_SUITES)
def test_a_ray_suite_runs_its_quick_form(name: str, models_root: Path, tmp_path: Path) -> None:
    code, stderr_tail, report = run_quick(name, models_root, tmp_path)
    assert code == 0, stderr_tail
    assert set(report) >= {"machine", "command", "args", "suites", "goals", "all_goals_met"}
    assert report["args"]["quick"] is True and report["args"]["no_peers"] is True
    assert list(report["suites"]) == [name]
    result = report["suites"][name]
    assert "error" not in result, result
    assert result["wall_s"] > 0
    # The report gathers the suite's goals under `<suite>.<goal>`; every suite states some.
    goals = result.get("goals", {})
    assert goals, f"{name}: no goals"
    assert set(report["goals"]) == {f"{name}.{goal}" for goal in goals}
    for goal in report["goals"].values():
        assert isinstance(goal["met"], bool), goal
