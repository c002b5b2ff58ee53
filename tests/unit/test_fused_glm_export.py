"""`--attention fused`: the slot-cache GLM-4 graph against transformers' logits (prefills, decode
steps, a ragged batch with a release, buffer growth), its MatMulNBits weights, its manifest."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from fused_glm_fixtures import export_fused, tiny_glm_checkpoint

from deployments.contracts.manifest import ModelManifest
from deployments.export.fused_parity import LOGITS_ATOL_FP32, open_session, verify_fused
from deployments.export.llm import export_llm
from deployments.replica.engine.slot_decoder import SlotDecoder


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_glm_checkpoint(tmp_path_factory.mktemp("tiny-glm"))


@pytest.fixture(scope="module")
def fused_fp32(checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("fused") / "glm"
    return out, export_fused(checkpoint[1], out)


def test_fused_graph_matches_transformers_prefill_decode_and_ragged_batch(checkpoint, fused_fp32):
    model, _ = checkpoint
    out, manifest = fused_fp32
    report = verify_fused(model, out, manifest)
    assert report["alone_max_abs_diff"] < LOGITS_ATOL_FP32
    assert report["ragged_max_abs_diff"] < LOGITS_ATOL_FP32
    assert report["greedy_agreement"] == 1.0
    assert report["logits_spread"] > 1.0  # not a trivially flat model


def test_the_manifest_names_the_slot_layout_and_the_prepacked_graph(fused_fp32):
    out, manifest = fused_fp32
    assert manifest.llm.kv_cache.layout == "slots"
    assert manifest.cpu_prepacked_graph is not None
    assert ModelManifest.load(out) == manifest
    assert not manifest.verify_files(out)
    ops = {
        n.op_type for n in onnx.load(str(out / manifest.graph), load_external_data=False).graph.node
    }
    assert {"GroupQueryAttention", "RotaryEmbedding", "FusedMatMul"} <= ops


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_matmul_nbits_graph_is_close_to_fp32(quantize, checkpoint, fused_fp32, tmp_path):
    model, path = checkpoint
    out = tmp_path / quantize
    manifest = export_fused(path, out, quantize)
    graph = onnx.load(str(out / manifest.graph), load_external_data=False).graph
    ops = [n.op_type for n in graph.node]
    assert "MatMulNBits" in ops
    assert manifest.quantization == quantize
    report = verify_fused(model, out, manifest)  # raises past its tolerance

    def prefill(model_dir, man):
        decoder = SlotDecoder(open_session(model_dir, man), man.llm.kv_cache, man.vocab_size, 1, 64)
        return decoder.prefill([5, 17, 301, 42, 9, 1000, 77])[1]

    fp32 = prefill(*fused_fp32)
    got = prefill(out, manifest)
    assert np.isfinite(got).all()
    relative = np.abs(got - fp32).max() / np.abs(fp32).max()
    assert relative < (0.1 if quantize == "int8" else 0.5)
    if quantize == "int8":
        assert report["greedy_agreement"] >= 0.8


def test_int4_and_kimi_need_what_the_fused_path_builds(tmp_path):
    with pytest.raises(ValueError, match="int4"):
        export_llm("glm", None, tmp_path / "a", quantize="int4")
    with pytest.raises(ValueError, match="fused"):
        export_llm("kimi", None, tmp_path / "b", attention="fused")
