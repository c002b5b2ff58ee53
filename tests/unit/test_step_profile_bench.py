"""`benchmarks.at_size.step_profile` runs on the tiny models: the decode split per batch size,
ONNX Runtime's ops per decode step (MatMuls by input shape), and the prefill stall per chunk size
and pacer share on a slot-cache (fused) export and on the plain graph."""

from __future__ import annotations

from pathlib import Path

import pytest
from fused_glm_fixtures import export_fused, tiny_glm_checkpoint

from benchmarks.at_size.step_profile import main


def test_decode_split_and_ort_ops_on_the_tiny_glm(models_root: Path) -> None:
    report = main(
        ["--model-dir", str(models_root / "glm"), "--batches", "1", "2"]
        + ["--runs", "1", "--max-tokens", "4", "--threads", "1", "--ort-ops"]
    )
    for size in ("1", "2"):
        split = report["decode"][size]
        assert split["tokens_per_s"] > 0 and split["graph_ms"] > 0
        assert split["sample_batch_ms"] > 0
        ops = report["ort_ops"][size]
        assert ops["steps"] > 0 and "MatMul" in ops["ops_ms"]
        # The heaviest MatMuls are the weights', fed one new token per row: [batch, 1, width].
        assert f"[{size}, 1, " in next(iter(ops["matmuls_ms"]))


@pytest.mark.parametrize("layout", ["slots", "plain"])
def test_stall_per_chunk_size(layout: str, models_root: Path, tmp_path: Path) -> None:
    """On a slot-cache (fused) export of a tiny GLM, and on the plain tiny Kimi (MLA)."""
    model_dir = models_root / "kimi"
    if layout == "slots":
        _, checkpoint = tiny_glm_checkpoint(tmp_path / "checkpoint")
        model_dir = tmp_path / "fused"
        export_fused(checkpoint, model_dir)
    report = main(
        ["--model-dir", str(model_dir), "--batches", "2", "--runs", "1"]
        + ["--max-tokens", "4", "--threads", "1", "--stall-chunks", "8", "32"]
        + ["--stall-shares", "none", "0.5"]
        + ["--stall-streams", "2", "--stall-prompt-tokens", "40"]
    )
    assert set(report["stall"]) == {"8@none", "32@none", "8@0.5", "32@0.5"}
    for stall in report["stall"].values():
        assert stall["ttft_s"] > 0 and stall["gap_median_before_ms"] > 0
        assert stall["p99_during_over_median_before"] <= stall["max_during_over_median_before"]
