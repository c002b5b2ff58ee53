"""The exported decoder graphs against PyTorch: logits, KV-cached decoding, ragged batches."""

from __future__ import annotations

import json

import numpy as np
import pytest

from deployments.contracts.manifest import ModelManifest
from deployments.export.common import VerificationError
from deployments.export.llm import default_model, export_llm, save_checkpoint, verify_llm
from deployments.replica.engine.decoder import DecoderGraph
from deployments.replica.engine.session import SessionConfig, cuda_available, open_session

FAMILIES = ["glm", "kimi"]


def _graph(model_dir) -> DecoderGraph:
    manifest = ModelManifest.load(model_dir)
    return DecoderGraph(open_session(model_dir / manifest.graph), manifest.llm.kv_cache)


@pytest.mark.parametrize("family", FAMILIES)
def test_onnx_matches_pytorch_fp32(family, models_root, tmp_path):
    model, _ = default_model(family, tmp_path)
    manifest = ModelManifest.load(models_root / family)
    report = verify_llm(model.eval(), models_root / family, manifest)
    assert report["logits_max_abs_diff"] < 1e-3
    assert report["cached_vs_recompute_max_abs_diff"] < 1e-3
    assert report["greedy_tokens_match_pytorch"] == 16


@pytest.mark.parametrize("family", FAMILIES)
def test_the_saved_checkpoint_is_the_served_graphs_weights_with_its_end_tokens(
    family, models_root, tmp_path
):
    # What a peer engine (vLLM) loads: transformers' own loader, the served model's stop tokens.
    from transformers import AutoModelForCausalLM

    checkpoint = save_checkpoint(family, tmp_path / family)
    config = json.loads((checkpoint / "config.json").read_text())
    manifest = ModelManifest.load(models_root / family)
    assert config["eos_token_id"] == manifest.llm.eos_token_ids
    assert config["architectures"] == [manifest.architecture]
    assert (checkpoint / "tokenizer.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    report = verify_llm(model, models_root / family, manifest)
    assert report["greedy_tokens_match_pytorch"] == 16


@pytest.mark.parametrize("family", FAMILIES)
def test_kv_cached_greedy_equals_full_recompute(family, models_root):
    graph = _graph(models_root / family)
    prompt = [5, 17, 301, 42, 9, 1000, 77]
    assert graph.greedy_cached(prompt, 24) == graph.greedy_full_recompute(prompt, 24)


@pytest.mark.parametrize("family", FAMILIES)
def test_ragged_batch_decode_matches_single(family, models_root):
    graph = _graph(models_root / family)
    prompts = [[11, 12, 13], [21, 22, 23, 24, 25, 26, 27, 28], [31]]
    caches = [graph.prefill(p)[1] for p in prompts]
    together, new_caches = graph.decode([3, 4, 5], caches)
    for row, (prompt, token) in enumerate(zip(prompts, [3, 4, 5], strict=True)):
        alone, (cache,) = graph.decode([token], [graph.prefill(prompt)[1]])
        np.testing.assert_allclose(together[row], alone[0], atol=1e-4)
        assert new_caches[row].length == len(prompt) + 1 == cache.length


def test_default_build_is_deterministic_and_manifest_complete(models_root, tmp_path):
    rebuilt = export_llm("glm", None, tmp_path / "glm")
    shipped = ModelManifest.load(models_root / "glm")
    assert rebuilt.files == shipped.files  # same sha256 for every file
    assert {"model.onnx", "tokenizer.json", "config.json"} <= set(shipped.files)
    assert shipped.verify_files(models_root / "glm") == []
    layout = shipped.llm.kv_cache
    assert layout.num_layers == 2 and shipped.llm.eos_token_ids
    assert "<|assistant|>" in shipped.llm.chat_template


def test_make_models_rebuilds_a_chat_default_an_older_exporter_built(models_root, tmp_path):
    import shutil

    from deployments.export.defaults import is_built

    shutil.copytree(models_root / "kimi", tmp_path / "kimi")
    assert is_built(tmp_path, "kimi")
    manifest_path = tmp_path / "kimi" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    # What the exporter wrote before the Kimi-K2 widths: files intact, an older recipe.
    manifest["source"] = "embedded default: tiny DeepseekV3ForCausalLM, seed 0"
    manifest_path.write_text(json.dumps(manifest))
    assert not is_built(tmp_path, "kimi")
    assert not is_built(tmp_path, "glm")  # absent


def test_kimi_cache_is_the_compressed_mla_latent(models_root):
    layout = ModelManifest.load(models_root / "kimi").llm.kv_cache
    # Multi-head latent attention caches one shared latent (kv_lora_rank) plus the rope key, at
    # Kimi-K2's own widths.
    assert (layout.num_kv_heads, layout.key_head_dim, layout.value_head_dim) == (1, 512, 64)


def test_kimi_attends_over_the_latent_without_expanding_the_cache(models_root):
    # The latent's up-projection is absorbed into the query and the output: the cached latent
    # meets only the queries and the attention weights, never a weight matrix (which would
    # expand every cached position at every step).
    import onnx

    manifest = ModelManifest.load(models_root / "kimi")
    model = onnx.load(models_root / "kimi" / manifest.graph, load_external_data=False)
    weights = {init.name for init in model.graph.initializer}
    latent = {f"present.{layer}.key" for layer in range(manifest.llm.kv_cache.num_layers)}
    products = 0
    for node in model.graph.node:  # topological order: a view of the latent is seen first
        if node.op_type in ("Transpose", "Reshape", "Unsqueeze") and node.input[0] in latent:
            latent.update(node.output)
        elif node.op_type == "MatMul" and latent & set(node.input):
            products += 1
            assert not weights & set(node.input), f"{node.name} multiplies the cache by a weight"
    assert products == 2 * manifest.llm.kv_cache.num_layers  # scores and the weighted sum


def test_kimi_checkpoint_declares_its_expert_routing(tmp_path):
    # vLLM reads the routing from config.json (softmax and no correction bias by default) and
    # refuses a checkpoint whose router carries a bias it was not told about.
    checkpoint = save_checkpoint("kimi", tmp_path / "kimi")
    config = json.loads((checkpoint / "config.json").read_text())
    assert (config["topk_method"], config["scoring_func"]) == ("noaux_tc", "sigmoid")


@pytest.mark.parametrize("options", [{"dtype": "fp16"}, {"quantize": "int8"}])
def test_fp16_and_int8_exports_verify(options, tmp_path):
    manifest = export_llm("glm", None, tmp_path / "glm", verify=True, **options)
    graph = _graph(tmp_path / "glm")
    expected_cache = np.float16 if options.get("dtype") == "fp16" else np.float32
    assert graph.cache_dtype == expected_cache
    assert manifest.quantization == options.get("quantize")


def test_verify_fails_loudly_on_a_different_model(models_root, tmp_path):
    other, _ = default_model("glm", tmp_path)
    with __import__("torch").no_grad():
        for p in other.parameters():
            p.add_(0.05)
    manifest = ModelManifest.load(models_root / "glm")
    with pytest.raises(VerificationError):
        verify_llm(other.eval(), models_root / "glm", manifest)


def test_session_reports_provider_and_load_time(models_root):
    session = open_session(models_root / "glm" / "model.onnx", SessionConfig(provider="auto"))
    # `auto` takes the GPU where there is one and falls back to the CPU, never fails.
    assert session.provider == ("cuda" if cuda_available() else "cpu")
    assert session.load_s > 0
    if not cuda_available():
        with pytest.raises(RuntimeError, match="cuda"):
            open_session(models_root / "glm" / "model.onnx", SessionConfig(provider="cuda"))
