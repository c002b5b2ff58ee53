"""Prompts' KV caches reused by prompts that start the same way: the index, its bound, and the
same answers with and without it on the default chat models."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from pydantic import ValidationError

from deployments.config import MIB, BatchingConfig
from deployments.contracts.sampling_params import SamplingParams
from deployments.contracts.session_config import SessionConfig
from deployments.replica.chat import ChatServer
from deployments.replica.engine.decoder import KVCache
from deployments.replica.engine.llm import LLMRuntime
from deployments.replica.engine.prefix_cache import BLOCK_TOKENS, DEFAULT_MAX_BYTES, PrefixCache

SYSTEM = {
    "role": "system",
    "content": "You are the support assistant of a railway company. Answer briefly and politely, "
    "in the language of the question, and never invent a timetable.",
}


def _cache(length: int, seed: int = 0, heads: int = 2) -> KVCache:
    """A fake two-layer cache whose values say which prompt and position they belong to."""
    rng = np.random.default_rng(seed)
    return KVCache(
        [
            (
                rng.standard_normal((1, heads, length, 4)).astype(np.float32),
                rng.standard_normal((1, heads, length, 3)).astype(np.float32),
            )
            for _ in range(2)
        ]
    )


def test_a_prompt_sharing_a_cached_start_gets_exactly_that_many_positions():
    cache = PrefixCache()
    stored = list(range(100, 140))
    assert cache.match(stored) is None
    kv = _cache(len(stored))
    cache.store(stored, kv)

    hit = cache.match(stored[:21] + [7, 8, 9])
    assert hit is not None and hit.length == 21  # past the block, up to the first difference
    for (key, value), (key0, value0) in zip(hit.cache.layers, kv.layers, strict=True):
        np.testing.assert_array_equal(key, key0[:, :, :21])
        np.testing.assert_array_equal(value, value0[:, :, :21])
    assert cache.hits == 1 and cache.reused_tokens == 21


def test_the_same_prompt_again_leaves_its_last_token_to_prefill():
    cache = PrefixCache()
    prompt = list(range(40))
    cache.store(prompt, _cache(40))
    hit = cache.match(prompt)
    assert hit is not None and hit.length == 39 and hit.cache.length == 39


def test_less_than_a_block_in_common_is_no_match():
    cache = PrefixCache()
    cache.store(list(range(40)), _cache(40))
    assert cache.match(list(range(BLOCK_TOKENS - 1)) + [999] * 30) is None
    cache.store(list(range(BLOCK_TOKENS - 1)), _cache(BLOCK_TOKENS - 1))  # too short to index
    assert cache.describe()["prompts"] == 1


def test_least_recently_used_prompts_go_beyond_the_bound():
    one = _cache(32).layers
    cache = PrefixCache(max_bytes=2 * sum(key.nbytes + value.nbytes for key, value in one))
    a, b, c = ([base + i for i in range(32)] for base in (0, 1000, 2000))
    cache.store(a, _cache(32, 1))
    cache.store(b, _cache(32, 2))
    assert cache.match(a + [5]) is not None  # a is now the most recently used
    cache.store(c, _cache(32, 3))
    assert cache.tokens == 64 and cache.nbytes == cache.max_bytes
    assert cache.match(b + [5]) is None
    assert cache.match(a + [5]) is not None and cache.match(c + [5]) is not None


def test_off_keeps_nothing_and_a_wrong_cache_is_refused():
    off = PrefixCache(max_bytes=0)
    off.store(list(range(40)), _cache(40))
    assert off.match(list(range(40))) is None and off.tokens == 0
    with pytest.raises(ValueError, match="max_bytes"):
        PrefixCache(max_bytes=-1)
    with pytest.raises(ValueError, match="40 positions for 41 tokens"):
        PrefixCache().store(list(range(41)), _cache(40))


@pytest.mark.parametrize("family", ["glm", "kimi"])
def test_a_conversation_sharing_a_start_reuses_it_and_answers_the_same(family, models_root):
    reusing = LLMRuntime(models_root / family, max_batch_size=4)
    fresh = LLMRuntime(models_root / family, max_batch_size=4, prefix_cache_bytes=0)
    first = [SYSTEM, {"role": "user", "content": "When does the first train leave?"}]
    second = [SYSTEM, {"role": "user", "content": "Can I take my bicycle on board?"}]
    greedy = SamplingParams(max_tokens=16, temperature=0)
    try:
        answers = [asyncio.run(reusing.complete(m, greedy)).text for m in (first, second)]
        assert reusing.prefix_cache.hits == 1
        shared = len(reusing.tokenizer.encode_chat([SYSTEM]))  # at least the system turn
        assert reusing.prefix_cache.reused_tokens >= min(shared, BLOCK_TOKENS)
        assert answers == [asyncio.run(fresh.complete(m, greedy)).text for m in (first, second)]
        assert fresh.prefix_cache.hits == 0

        # Four at once, all starting the same way: each reuses it and still answers as alone.
        prompts = [
            [SYSTEM, {"role": "user", "content": f"Question {i}: " + "which platform? " * i}]
            for i in range(4)
        ]

        async def together(runtime):
            return await asyncio.gather(*(runtime.complete(p, greedy) for p in prompts))

        hits = reusing.prefix_cache.hits
        assert [c.text for c in asyncio.run(together(reusing))] == [
            c.text for c in asyncio.run(together(fresh))
        ]
        assert reusing.prefix_cache.hits == hits + len(prompts)
        assert reusing.describe()["prefix_cache"]["prompts"] >= 2
    finally:
        reusing.close()
        fresh.close()


@pytest.mark.parametrize("family", ["glm", "kimi"])
def test_the_rest_of_a_prompt_after_a_cached_start_gives_the_whole_prompts_logits(
    family, models_root
):
    runtime = LLMRuntime(models_root / family, prefix_cache_bytes=0)
    try:
        graph = runtime.graph
        prompt = [int(t) for t in np.random.default_rng(3).integers(10, 2000, size=40)]
        whole_logits, whole = graph.prefill_batch([prompt])
        _, start = graph.prefill(prompt[:23])
        rest_logits, rest = graph.prefill_after([start], [prompt[23:]])
        np.testing.assert_allclose(rest_logits[0], whole_logits[0], atol=1e-4)
        (cache,) = rest.split()
        for (key, value), (key0, value0) in zip(cache.layers, whole.split()[0].layers, strict=True):
            np.testing.assert_allclose(key, key0, atol=1e-4)
            np.testing.assert_allclose(value, value0, atol=1e-4)
        # And the next step decodes from it as from the whole prompt's cache.
        after_rest, _ = graph.decode([7], [cache])
        after_whole, _ = graph.decode([7], whole.split())
        np.testing.assert_allclose(after_rest, after_whole, atol=1e-4)
    finally:
        runtime.close()


def test_resizing_drops_the_least_recently_used_and_zero_turns_it_off():
    one = sum(key.nbytes + value.nbytes for key, value in _cache(32).layers)
    cache = PrefixCache(max_bytes=3 * one)
    prompts = [[base + i for i in range(32)] for base in (0, 1000, 2000)]
    for seed, prompt in enumerate(prompts):
        cache.store(prompt, _cache(32, seed))
    cache.resize(one)
    assert [cache.match(p + [1]) is not None for p in prompts] == [False, False, True]
    cache.resize(0)
    assert cache.tokens == 0 and cache.match(prompts[2] + [1]) is None
    with pytest.raises(ValueError, match="max_bytes"):
        cache.resize(-1)


def test_a_chat_replicas_user_config_sizes_its_prefix_cache(models_root):
    server = ChatServer(str(models_root / "glm"), SessionConfig(provider="cpu"))
    try:
        assert BatchingConfig().prefix_cache_mb * MIB == DEFAULT_MAX_BYTES
        assert server.runtime.prefix_cache.max_bytes == DEFAULT_MAX_BYTES
        server.reconfigure({"max_batch_size": 4, "prefix_cache_mb": 0.5})
        assert server.runtime.prefix_cache.max_bytes == MIB // 2
        server.reconfigure({"prefix_cache_mb": 0})
        assert not server.runtime.prefix_cache.enabled
    finally:
        server.runtime.close()
    with pytest.raises(ValidationError, match="prefix_cache_mb"):
        BatchingConfig.model_validate({"prefix_cache_mb": -1})


@pytest.mark.parametrize("family", ["glm", "kimi"])
def test_rests_of_one_length_on_starts_of_one_length_run_together_as_alone(family, models_root):
    runtime = LLMRuntime(models_root / family, prefix_cache_bytes=0)
    try:
        graph = runtime.graph
        rng = np.random.default_rng(4)
        prompts = [[int(t) for t in rng.integers(10, 2000, size=30)] for _ in range(3)]
        starts = [graph.prefill(p[:20])[1] for p in prompts]
        together, batch = graph.prefill_after(starts, [p[20:] for p in prompts])
        for row, (prompt, start) in enumerate(zip(prompts, starts, strict=True)):
            alone, _ = graph.prefill_after([start], [prompt[20:]])
            np.testing.assert_allclose(together[row], alone[0], atol=1e-4)
        assert batch.lengths == [30, 30, 30]
        with pytest.raises(ValueError, match="one length"):
            graph.prefill_after(starts, [prompts[0][20:], prompts[1][21:], prompts[2][20:]])
    finally:
        runtime.close()


def test_a_burst_of_one_cached_prompt_is_prefilled_in_one_run(models_root, monkeypatch):
    runtime = LLMRuntime(models_root / "kimi", max_batch_size=4)
    runs: list[int] = []
    prefill_after = runtime.graph.prefill_after

    def counted(caches, rests):
        runs.append(len(caches))
        return prefill_after(caches, rests)

    monkeypatch.setattr(runtime.graph, "prefill_after", counted)
    messages = [SYSTEM, {"role": "user", "content": "Is the night train on time?"}]
    seeded = [SamplingParams(max_tokens=8, temperature=0.7, seed=s) for s in range(3)]

    async def burst():
        return await asyncio.gather(*(runtime.complete(messages, p) for p in seeded))

    try:
        asyncio.run(runtime.complete(messages, SamplingParams(max_tokens=2)))  # now cached
        answers = asyncio.run(burst())
        assert runs == [3]  # three rows, one graph run
        assert [a.prompt_tokens for a in answers] == [
            len(runtime.tokenizer.encode_chat(messages))
        ] * 3
    finally:
        runtime.close()
