"""The load tester's cold-start scenario against the live cluster."""

from __future__ import annotations

import json

from conftest import kimi_burst_after_idle


def test_burst_after_idle_reports_a_cold_start_and_no_errors(serve_cluster, tmp_path):
    out = tmp_path / "report"
    summary = kimi_burst_after_idle(serve_cluster, out, duration_s=3, replicas_every_s=1)
    text = json.dumps(summary)
    assert (out / "requests.csv").is_file() and (out / "report.md").is_file()
    assert list(out.glob("*.png"))
    assert summary["requests"]["recorded"] > 0
    assert summary["requests"]["errors"] == 0, text[:2000]
    assert summary["cold_start"]["count"] >= 1, text[:2000]
    assert summary["cold_start"]["duration_ms"]["p50"] > 0
    assert summary["by_phase"]["burst"]["cold_starts"] >= 1
