"""The KV cache kept in device memory between decode steps (ORT IO binding), run on the CPU
provider: same logits as the host path, and only ids, mask, positions and logits cross."""

from __future__ import annotations

import asyncio

import numpy as np
import onnxruntime as ort
import pytest

from deployments.contracts.manifest import ModelManifest
from deployments.contracts.sampling_params import SamplingParams
from deployments.replica.engine.decoder import DecoderGraph, PaddedBatch
from deployments.replica.engine.llm import LLMRuntime
from deployments.replica.engine.session import SessionConfig, open_session

PROMPTS = ([5, 17, 42, 99, 7], [3, 8], [250, 251, 252, 253, 254, 255, 256, 257])
STEPS = 12


def _graph(model_dir, io_binding: bool) -> DecoderGraph:
    manifest = ModelManifest.load(model_dir)
    assert manifest.llm is not None
    session = open_session(
        model_dir / manifest.graph, SessionConfig(provider="cpu", io_binding=io_binding)
    )
    return DecoderGraph(session, manifest.llm.kv_cache)


@pytest.fixture(scope="module", params=["glm", "kimi"])
def graphs(request, models_root) -> tuple[DecoderGraph, DecoderGraph]:
    model_dir = models_root / request.param
    return _graph(model_dir, io_binding=False), _graph(model_dir, io_binding=True)


def _greedy_batch(graph: DecoderGraph) -> tuple[list[np.ndarray], PaddedBatch]:
    """Prefill each prompt, then STEPS greedy steps of the three as one left-padded batch."""
    firsts, caches = zip(*(graph.prefill(p) for p in PROMPTS), strict=True)
    batch = PaddedBatch.of(graph, list(caches))
    tokens = [int(np.argmax(logits)) for logits in firsts]
    rows = []
    for _ in range(STEPS):
        logits = batch.step(tokens)
        rows.append(logits)
        tokens = [int(t) for t in np.argmax(logits, axis=1)]
    return rows, batch


def test_device_cache_matches_the_host_path(graphs) -> None:
    host, device = graphs
    host_rows, host_batch = _greedy_batch(host)
    device_rows, device_batch = _greedy_batch(device)
    for expected, actual in zip(host_rows, device_rows, strict=True):
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)
    # Between steps the cache is OrtValues, never copied back; split() brings it home once.
    assert all(isinstance(k, ort.OrtValue) for k, _ in device_batch.past)
    assert all(isinstance(k, np.ndarray) for k, _ in host_batch.past)
    for ours, theirs in zip(device_batch.split(), host_batch.split(), strict=True):
        assert ours.length == theirs.length
        for (k1, v1), (k2, v2) in zip(ours.layers, theirs.layers, strict=True):
            np.testing.assert_allclose(k1, k2, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(v1, v2, rtol=1e-5, atol=1e-5)


def test_only_small_tensors_cross_per_step(graphs) -> None:
    host, device = graphs
    _, batch = _greedy_batch(device)  # the first step uploads the padded cache once
    transfers = device.session.transfers
    before_up, before_down = transfers.host_to_device, transfers.device_to_host
    batch.step([1, 2, 3])
    up = transfers.host_to_device - before_up
    down = transfers.device_to_host - before_down
    rows, width = len(PROMPTS), batch.mask.shape[1]
    assert up == 8 * rows * (1 + width + 1)  # int64 ids, mask (one longer now), positions
    vocab = device.session.session.get_outputs()[0].shape[-1]
    assert down == rows * vocab * 4  # fp32 logits of the last position, nothing else
    # A longer cache costs one more mask column per row, not the cache itself.
    before_up = transfers.host_to_device
    batch.step([4, 5, 6])
    assert transfers.host_to_device - before_up == up + 8 * rows
    # The host path moves the whole cache both ways every step.
    _, host_batch = _greedy_batch(host)
    before_up, before_down = (
        host.session.transfers.host_to_device,
        host.session.transfers.device_to_host,
    )
    past_bytes = sum(k.nbytes + v.nbytes for k, v in host_batch.past)
    host_batch.step([4, 5, 6])
    present_bytes = sum(k.nbytes + v.nbytes for k, v in host_batch.past)
    assert host.session.transfers.host_to_device - before_up == up + past_bytes
    assert host.session.transfers.device_to_host - before_down == down + present_bytes


def test_runtime_completions_do_not_depend_on_io_binding(models_root) -> None:
    messages = [{"role": "user", "content": "Tell me about Paris."}]
    params = [SamplingParams(max_tokens=16, temperature=0.8, seed=seed) for seed in range(3)]
    texts = []
    for io_binding in (False, True):
        runtime = LLMRuntime(
            models_root / "glm", SessionConfig(provider="cpu", io_binding=io_binding)
        )

        async def together(runtime: LLMRuntime = runtime) -> list[str]:
            done = await asyncio.gather(*(runtime.complete(messages, p) for p in params))
            return [c.text for c in done]

        texts.append(asyncio.run(together()))
        runtime.close()
    assert texts[0] == texts[1]
