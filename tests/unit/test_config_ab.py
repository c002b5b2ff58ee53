"""benchmarks.at_size.config_ab without a cluster: the configs' order alternates round by round
(so the machine's drift falls on both), each round serves every config afresh with the same
sizes, and each config's median is over all its bursts."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.at_size import config_ab
from benchmarks.at_size.config import AtSizeBenchConfig


def test_rounds_alternate_the_configs_and_each_median_takes_every_burst(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    served: list[AtSizeBenchConfig] = []
    figures = {old: iter([[40.0, 42.0], [30.0, 50.0]]), new: iter([[60.0, 61.0], [70.0, 1.0]])}

    def measured(config: AtSizeBenchConfig) -> list[float]:
        served.append(config)
        return next(figures[config.serve_config])

    monkeypatch.setattr(config_ab, "concurrent_tokens_per_s", measured)
    report = config_ab.compare([old, new], 2, 2, tmp_path / "models", tmp_path / "large")
    assert [c.serve_config for c in served] == [old, new, new, old]
    assert {(c.runs, c.models[0], c.ttft_streams) for c in served} == {(2, "glm", 1)}
    by_config = report["concurrent_tokens_per_s"]
    assert by_config[str(old)] == {"bursts": [40.0, 42.0, 30.0, 50.0], "median": 41.0}
    assert by_config[str(new)] == {"bursts": [60.0, 61.0, 70.0, 1.0], "median": 60.5}
