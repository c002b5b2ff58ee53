"""A long prompt on the plain (`concat` cache) graph, GLM and Kimi (MLA), prefilled in chunks:
the same greedy tokens as in one run, nothing reported as cached that was not, and the streams
already decoding take a step between two chunks (`DecoderStepRunner._ahead_in_chunks`) and end
with the tokens they would have had alone; the chunk size and the pacer's share from a chat
replica's user_config."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from deployments.config import BatchingConfig
from deployments.contracts.sampling_params import SamplingParams
from deployments.replica.chat import ChatServer
from deployments.replica.engine.llm import LLMRuntime
from deployments.replica.engine.session import SessionConfig
from deployments.replica.engine.step_runner import (
    DEFAULT_PREFILL_CHUNK_TOKENS,
    DEFAULT_PREFILL_STEP_SHARE,
    DecoderStepRunner,
)

CHUNK = 16
LONG = [{"role": "user", "content": "Tell me everything about the rivers of Beijing " * 6}]
# Another long prompt: LONG, answered in the first test, would be found in the prefix cache.
OTHER_LONG = [{"role": "user", "content": "Name every bridge over the Seine in Paris " * 6}]
# Long enough to outlast the long prompt's chunks (the engine thread steps them back to back
# until it is admitted); neither meets its end-of-text within 160 tokens.
STREAMS = [("Paris and 北京", 160), ([{"role": "user", "content": "hi there"}], 160)]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0)


@pytest.fixture(scope="module", params=["glm", "kimi"])
def runtimes(request, models_root):
    chunked = LLMRuntime(models_root / request.param, max_batch_size=4, prefill_chunk_tokens=CHUNK)
    whole = LLMRuntime(models_root / request.param, max_batch_size=4, prefix_cache_bytes=0)
    yield chunked, whole
    chunked.close()
    whole.close()


def test_a_long_prompt_in_chunks_answers_as_in_one_run(runtimes):
    chunked, whole = runtimes
    assert isinstance(chunked.runner, DecoderStepRunner)
    prompt_tokens = len(chunked.tokenizer.encode_chat(LONG))
    assert CHUNK * 3 < prompt_tokens < whole.runner.prefill_chunk_tokens
    got = asyncio.run(chunked.complete(LONG, greedy(16)))
    expected = asyncio.run(whole.complete(LONG, greedy(16)))
    assert (got.text, got.completion_tokens) == (expected.text, expected.completion_tokens)
    assert got.cached_tokens == 0  # computed in chunks, not found in the prefix cache


def test_running_streams_decode_between_the_chunks_and_answer_as_alone(runtimes, monkeypatch):
    chunked, _ = runtimes
    alone = [asyncio.run(chunked.complete(p, greedy(n))).text for p, n in STREAMS]
    runner = chunked.runner
    calls: list[str] = []
    prefill_after, step = runner.graph.prefill_after, runner.step

    def recorded_prefill_after(caches, rests):
        calls.append("chunk")
        return prefill_after(caches, rests)

    def recorded_step(admitted, running):
        calls.append(f"step {len(running)}+{len(admitted)}")
        return step(admitted, running)

    monkeypatch.setattr(runner.graph, "prefill_after", recorded_prefill_after)
    monkeypatch.setattr(runner, "step", recorded_step)

    async def together() -> list[str]:
        streams = [chunked.stream(p, greedy(n)) for p, n in STREAMS]
        firsts = [(await stream.__anext__()).text for stream in streams]  # both decoding
        calls.clear()
        long = asyncio.ensure_future(chunked.complete(OTHER_LONG, greedy(4)))
        rests = [await collect(stream) for stream in streams]
        await long
        return [first + rest for first, rest in zip(firsts, rests, strict=True)]

    assert asyncio.run(together()) == alone
    # Chunks on the first (`prefill`, not recorded), each followed by the two streams' step;
    # the last chunk goes with the step that admits the long prompt.
    admitted = calls.index("step 2+1")
    assert calls[admitted - 4 : admitted] == ["chunk", "step 2+0", "chunk", "step 2+0"]


async def collect(stream) -> str:
    return "".join([chunk.text async for chunk in stream])


def test_a_chat_replicas_user_config_sets_its_chunk_size_and_pacing(models_root):
    assert BatchingConfig().prefill_chunk_tokens == DEFAULT_PREFILL_CHUNK_TOKENS
    assert BatchingConfig().prefill_step_share == DEFAULT_PREFILL_STEP_SHARE
    server = ChatServer(str(models_root / "kimi"), SessionConfig(provider="cpu"))
    try:
        runner = server.runtime.runner
        assert runner.prefill_chunk_tokens == DEFAULT_PREFILL_CHUNK_TOKENS
        assert runner.pacer.step_share == DEFAULT_PREFILL_STEP_SHARE
        server.reconfigure({"max_batch_size": 4, "prefill_chunk_tokens": 64})
        assert runner.prefill_chunk_tokens == 64
        server.reconfigure({"prefill_step_share": 0.5})
        assert (runner.prefill_chunk_tokens, runner.pacer.step_share) == (256, 0.5)
        server.reconfigure({"prefill_step_share": None})
        assert runner.pacer.step_share is None
    finally:
        server.runtime.close()
    with pytest.raises(ValidationError, match="prefill_chunk_tokens"):
        BatchingConfig.model_validate({"prefill_chunk_tokens": 8})
    with pytest.raises(ValidationError, match="prefill_step_share"):
        BatchingConfig.model_validate({"prefill_step_share": 0})
