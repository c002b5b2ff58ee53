"""The plain-layout runtime (the default tiny GLM) under a KV budget: a chat replica's
`kv_budget_mb` sets it (and is refused with its numbers when one whole context would not fit),
the prefix cache gets only what the running sequences leave, and streams preempted when they
outgrow the budget answer as each alone. Metrics report bytes, budget and preemptions."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from pydantic import ValidationError

from deployments.config import MIB, BatchingConfig
from deployments.contracts.sampling_params import SamplingParams
from deployments.contracts.session_config import SessionConfig
from deployments.observability.metrics import ModelMetrics
from deployments.observability.metrics_backend import InMemoryMetricsBackend
from deployments.replica.chat import ChatServer
from deployments.replica.engine.decoder import KVCache
from deployments.replica.engine.prefix_cache import BLOCK_TOKENS, PrefixCache

CONTEXT = 64  # positions the test's runtime serves, so a few sequences fill the budget


@pytest.fixture(scope="module")
def server(models_root):
    server = ChatServer(str(models_root / "glm"), SessionConfig(provider="cpu"))
    yield server
    server.runtime.close()


def test_the_user_config_sets_the_budget_and_refuses_one_too_small(server):
    runtime = server.runtime
    one_context = runtime.runner.kv_footprint(1, runtime.context_length)
    server.reconfigure({"kv_budget_mb": (one_context * 2) / MIB})
    assert runtime.kv_budget.limit_bytes == int(one_context * 2 / MIB * MIB)
    assert runtime.describe()["kv_cache"]["budget_bytes"] == runtime.kv_budget.limit_bytes
    with pytest.raises(ValueError, match=f"{runtime.context_length} positions need"):
        server.reconfigure({"kv_budget_mb": one_context / 2 / MIB, "max_batch_size": 3})
    assert server.batching.kv_budget_mb == one_context * 2 / MIB  # the refused one left no trace
    assert runtime.max_batch_size != 3
    server.reconfigure({})
    assert runtime.kv_budget.limit_bytes is None
    with pytest.raises(ValidationError, match="kv_budget_mb"):
        BatchingConfig.model_validate({"kv_budget_mb": 0})


def test_the_prefix_cache_keeps_within_the_room_the_budget_leaves_it():
    cache = PrefixCache(1 << 20)
    layers = [(np.zeros((1, 2, BLOCK_TOKENS, 4), np.float32),) * 2]
    for first in range(3):
        cache.store([first] * BLOCK_TOKENS, KVCache(layers))
    entry = cache.nbytes // 3
    cache.fit_within(entry * 2)
    assert cache.nbytes == entry * 2 and cache.match([0] * (BLOCK_TOKENS + 1)) is None
    cache.store([7] * BLOCK_TOKENS, KVCache(layers))
    assert cache.nbytes == entry * 2  # the oldest went to make room


def test_preempted_streams_answer_as_each_alone(server):
    runtime = server.runtime
    backend = InMemoryMetricsBackend()
    server.observability.metrics = ModelMetrics(backend, "glm", "chat")
    runtime.context_length = CONTEXT
    runtime.set_kv_budget(runtime.runner.kv_footprint(1, CONTEXT))
    prompts = ["Paris and 北京", "Beijing rivers", "hello there"]
    params = SamplingParams(max_tokens=40, temperature=0)
    try:
        alone = [asyncio.run(runtime.complete(p, params)).text for p in prompts]
        before = runtime.kv_budget.preemptions

        async def together():
            return await asyncio.gather(*(runtime.complete(p, params) for p in prompts))

        assert [c.text for c in asyncio.run(together())] == alone
        assert runtime.kv_budget.preemptions > before
        server._report_kv_cache()
        preempted = backend.total("edge_model_kv_preemptions_total", model="glm")
        assert preempted == runtime.kv_budget.preemptions > 0
        budgets = backend.values("edge_model_kv_cache_budget_bytes", model="glm")
        assert budgets[-1] == runtime.kv_budget.limit_bytes
    finally:
        runtime.set_kv_budget(None)
