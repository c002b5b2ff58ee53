"""The load tester's cold-start scenario against the live cluster."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import KIMI_TO_ZERO_S, USER_KEY, wait_until


def test_burst_after_idle_reports_a_cold_start_and_no_errors(serve_cluster, tmp_path):
    wait_until(lambda: serve_cluster.running_replicas("kimi") == 0, 90, "kimi at zero replicas")
    out = tmp_path / "report"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgectl.loadtest",
            "--scenario=burst-after-idle",
            f"--url={serve_cluster.base_url}",
            f"--out={out}",
            "--models=kimi",
            f"--api-key={USER_KEY}",
            "--warm-s=1",
            f"--idle-s={KIMI_TO_ZERO_S + 12}",
            "--rate=4",
            "--duration-s=3",
            "--max-tokens=4",
            "--replicas-every-s=1",
            "--no-progress",
        ],
        env=serve_cluster.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    text = json.dumps(summary)
    assert (out / "requests.csv").is_file() and (out / "report.md").is_file()
    assert list(out.glob("*.png"))
    assert summary["requests"]["recorded"] > 0
    assert summary["requests"]["errors"] == 0, text[:2000]
    assert summary["cold_start"]["count"] >= 1, text[:2000]
    assert summary["cold_start"]["duration_ms"]["p50"] > 0
    assert summary["by_phase"]["burst"]["cold_starts"] >= 1
