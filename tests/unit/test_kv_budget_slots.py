"""A slot-cache runtime (the tiny fused GLM) under a KV budget: concurrent greedy streams that
outgrow it are preempted and resumed with the same tokens as each alone, the buffers never hold
more than the budget, and a budget below one whole context is refused with its numbers."""

from __future__ import annotations

import asyncio

import pytest
from fused_glm_fixtures import export_fused, tiny_glm_checkpoint

from deployments.contracts.sampling_params import SamplingParams
from deployments.replica.engine.llm import LLMRuntime

CONTEXT = 96  # positions: what the test's runtime serves, so a few sequences fill the budget
GROW_BY = 16  # capacity grows within the test's short answers


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    _, checkpoint = tiny_glm_checkpoint(tmp_path_factory.mktemp("tiny-glm"))
    model_dir = tmp_path_factory.mktemp("models") / "fused"
    export_fused(checkpoint, model_dir)
    rt = LLMRuntime(model_dir, max_batch_size=4, prefill_chunk_tokens=16)
    rt.context_length = CONTEXT
    rt.runner.decoder.grow_by = GROW_BY
    rt.set_kv_budget(rt.runner.kv_footprint(1, CONTEXT))  # one whole context, no more
    yield rt
    rt.close()


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0)


PROMPTS = ["Paris and 北京", "Beijing rivers", "hello there", "a b c"]


def test_preempted_streams_resume_with_the_tokens_of_each_alone(runtime):
    decoder = runtime.runner.decoder
    limit = runtime.kv_budget.limit_bytes
    alone = [asyncio.run(runtime.complete(p, greedy(40))).text for p in PROMPTS]
    held: list[int] = []
    step, extend = decoder.step, decoder.extend

    def counted_step(tokens):
        logits = step(tokens)
        held.append(decoder.nbytes)
        return logits

    def counted_extend(slot, tokens):
        logits = extend(slot, tokens)
        held.append(decoder.nbytes)
        return logits

    decoder.step, decoder.extend = counted_step, counted_extend
    before = runtime.kv_budget.preemptions

    async def together():
        async def text(prompt):
            return "".join([c.text async for c in runtime.stream(prompt, greedy(40))])

        return await asyncio.gather(*(text(p) for p in PROMPTS))

    try:
        assert asyncio.run(together()) == alone
    finally:
        del decoder.step, decoder.extend
    assert runtime.kv_budget.preemptions > before
    assert held and max(held) <= limit
    assert runtime.kv_usage()["budget_bytes"] == limit


def test_a_budget_below_one_whole_context_is_refused(runtime):
    one = runtime.runner.kv_footprint(1, CONTEXT)
    with pytest.raises(ValueError, match=f"{CONTEXT} positions need"):
        runtime.set_kv_budget(one - 1)
    with pytest.raises(ValueError, match="exceeds this host's memory"):
        runtime.set_kv_budget(1 << 60)
