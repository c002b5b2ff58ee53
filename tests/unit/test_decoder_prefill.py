"""Prefill as the chat runtime runs it: the next-token-only graph, and prompts of different
lengths left-padded into one run, against the exported graph and one prompt at a time."""

from __future__ import annotations

import numpy as np
import pytest

from deployments.contracts.manifest import ModelManifest
from deployments.replica.engine.decoder import DecoderGraph, PaddedBatch
from deployments.replica.engine.next_token_graph import next_token_only
from deployments.replica.engine.scheduler import (
    PREFILL_MAX_PADDED_TOKENS,
    PREFILL_MIN_FILL,
    prefill_groups,
)
from deployments.replica.engine.session import SessionConfig, open_session

PROMPTS = ([5, 17, 42, 99, 7, 8, 9, 10, 11], [3, 8], [250, 251, 252, 253, 254], [77])
STEPS = 6
TOLERANCE = 1e-5


def _graphs(model_dir) -> tuple[DecoderGraph, DecoderGraph]:
    """(as exported, as the runtime opens it)"""
    manifest = ModelManifest.load(model_dir)
    assert manifest.llm is not None
    path = model_dir / manifest.graph
    rewritten = next_token_only(path)
    assert rewritten is not None, "the default models' head is a plain MatMul"
    config = SessionConfig(provider="cpu")
    return (
        DecoderGraph(open_session(path, config), manifest.llm.kv_cache),
        DecoderGraph(open_session(rewritten, config), manifest.llm.kv_cache),
    )


@pytest.fixture(scope="module", params=["glm", "kimi"])
def graphs(request, models_root) -> tuple[DecoderGraph, DecoderGraph]:
    return _graphs(models_root / request.param)


def _assert_same_cache(ours, theirs) -> None:
    assert ours.length == theirs.length
    for (k1, v1), (k2, v2) in zip(ours.layers, theirs.layers, strict=True):
        np.testing.assert_allclose(k1, k2, rtol=TOLERANCE, atol=TOLERANCE)
        np.testing.assert_allclose(v1, v2, rtol=TOLERANCE, atol=TOLERANCE)


def test_next_token_graph_is_the_exported_graphs_last_row(graphs) -> None:
    exported, next_token = graphs
    prompt = list(PROMPTS[0])
    full = exported.full_logits(prompt)
    logits, cache = next_token.prefill(prompt)
    assert exported.all_positions and not next_token.all_positions
    np.testing.assert_allclose(logits, full[-1], rtol=TOLERANCE, atol=TOLERANCE)
    _assert_same_cache(cache, exported.prefill(prompt)[1])
    np.testing.assert_allclose(logits, exported.prefill(prompt)[0], rtol=TOLERANCE, atol=TOLERANCE)
    with pytest.raises(ValueError, match="next-token logits only"):
        next_token.full_logits(prompt)
    # Full recomputation (the models suite's reference) needs only each last row.
    assert next_token.greedy_full_recompute(prompt, 6) == exported.greedy_full_recompute(prompt, 6)
    assert next_token.greedy_full_recompute(prompt, 6) == next_token.greedy_cached(prompt, 6)


def test_batched_prefill_matches_one_prompt_at_a_time(graphs) -> None:
    _, graph = graphs
    logits, batch = graph.prefill_batch(PROMPTS)
    # Fully masked pad positions must not leak NaN into the rows or the cache they share.
    assert np.isfinite(logits).all()
    assert all(np.isfinite(k).all() and np.isfinite(v).all() for k, v in batch.past)
    alone = [graph.prefill(p) for p in PROMPTS]
    for row, (single_logits, single_cache) in enumerate(alone):
        np.testing.assert_allclose(logits[row], single_logits, rtol=TOLERANCE, atol=TOLERANCE)
        _assert_same_cache(batch.split()[row], single_cache)

    # The prefilled batch decodes on as the separately prefilled caches re-padded do.
    repadded = PaddedBatch.of(graph, [cache for _, cache in alone])
    tokens = [int(np.argmax(row)) for row in logits]
    for _ in range(STEPS):
        ours, theirs = batch.step(tokens), repadded.step(tokens)
        assert np.isfinite(ours).all()
        np.testing.assert_allclose(ours, theirs, rtol=TOLERANCE, atol=TOLERANCE)
        tokens = [int(t) for t in np.argmax(ours, axis=1)]
    for ours, theirs in zip(batch.split(), repadded.split(), strict=True):
        _assert_same_cache(ours, theirs)


@pytest.mark.parametrize(
    ("lengths", "groups"),
    [
        ([18] * 8, [list(range(8))]),  # the usual burst: one run
        ([5], [[0]]),
        ([9, 1, 8, 2], [[1, 3], [0, 2]]),  # shortest first; most of a run is real tokens
        ([20, 400, 22], [[0, 2], [1]]),  # one long prompt does not pad the short ones
        ([20, 200], [[0], [1]]),
        ([300, 300], [[0], [1]]),  # over the padded-token cap: each alone
    ],
)
def test_prefill_groups_keep_padding_and_run_size_bounded(lengths, groups) -> None:
    got = prefill_groups(lengths)
    assert got == groups
    assert sorted(i for group in got for i in group) == list(range(len(lengths)))
    for group in got:
        longest = max(lengths[i] for i in group)
        assert len(group) == 1 or len(group) * longest <= PREFILL_MAX_PADDED_TOKENS
        real = sum(lengths[i] for i in group)
        assert len(group) == 1 or real >= PREFILL_MIN_FILL * len(group) * longest


def test_a_graph_with_external_weights_is_rewritten_and_opened_beside_them(
    models_root, tmp_path
) -> None:
    """Exports past 1 GiB keep their weights in `model.onnx.data`: the rewrite leaves them
    where they are, and the session reads them from the graph's folder."""
    import onnx

    manifest = ModelManifest.load(models_root / "glm")
    assert manifest.llm is not None
    exported = models_root / "glm" / manifest.graph
    external = tmp_path / "model.onnx"
    onnx.save(
        onnx.load(str(exported)),
        str(external),
        save_as_external_data=True,
        location="model.onnx.data",
        size_threshold=1024,  # onnx.save's default: small constants stay inline
    )
    rewritten = next_token_only(external)
    assert rewritten is not None
    assert len(rewritten) < (tmp_path / "model.onnx.data").stat().st_size  # weights not inlined
    graph = DecoderGraph(
        open_session(rewritten, SessionConfig(provider="cpu"), external_data_dir=tmp_path),
        manifest.llm.kv_cache,
    )
    reference = DecoderGraph(
        open_session(exported, SessionConfig(provider="cpu")), manifest.llm.kv_cache
    )
    prompt = list(PROMPTS[0])
    np.testing.assert_allclose(
        graph.prefill(prompt)[0], reference.prefill(prompt)[0], rtol=TOLERANCE, atol=TOLERANCE
    )
