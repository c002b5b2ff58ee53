"""LLMRuntime: sampling, stop strings, limits, streaming and continuous batching on the defaults."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import pytest

from deployments.contracts.outputs import GenerationChunk, TokenLogprob, ToolCall, merge_chunks
from deployments.contracts.sampling_params import GenerationOptions, SamplingParams
from deployments.errors import (
    ContextLengthExceededError,
    EmptyInputError,
    InvalidRequestError,
)
from deployments.replica.engine.llm import LLMRuntime
from deployments.replica.engine.scheduler import prefill_groups
from deployments.replica.engine.step_profile import StepProfile
from tests.waiting import until

HELLO = [{"role": "user", "content": "Tell me about Beijing 北京 and Paris."}]


@pytest.fixture(scope="module", params=["glm", "kimi"])
def runtime(request, models_root) -> LLMRuntime:
    rt = LLMRuntime(models_root / request.param, max_batch_size=4)
    yield rt
    rt.close()


def run(coro):
    return asyncio.run(coro)


def test_seeded_sampling_is_reproducible(runtime):
    params = SamplingParams(max_tokens=24, temperature=1.0, top_p=0.9, seed=1234)
    first = run(runtime.complete(HELLO, params))
    again = run(runtime.complete(HELLO, params))
    other = [run(runtime.complete(HELLO, SamplingParams(max_tokens=24, seed=s))) for s in (1, 2, 3)]
    uncached = dataclasses.replace(again, cached_tokens=first.cached_tokens)
    assert first == uncached
    assert again.cached_tokens == again.prompt_tokens - 1  # all but the last read from the cache
    assert len({c.text for c in other}) > 1  # different seeds explore different continuations


def test_max_tokens_is_honoured(runtime):
    out = run(runtime.complete(HELLO, SamplingParams(max_tokens=7, temperature=0)))
    assert out.completion_tokens <= 7
    if out.finish_reason == "length":
        assert out.completion_tokens == 7
    assert out.prompt_tokens == len(runtime.tokenizer.encode_chat(HELLO))


def test_stop_string_cuts_text_and_finishes_with_stop(runtime):
    greedy = SamplingParams(max_tokens=40, temperature=0)
    full = run(runtime.complete(HELLO, greedy)).text
    assert len(full) > 6
    stop = full[4:7]
    cut = run(runtime.complete(HELLO, SamplingParams(max_tokens=40, temperature=0, stop=(stop,))))
    assert cut.finish_reason == "stop"
    assert cut.text == full[: full.index(stop)]
    assert stop not in cut.text


def test_stream_chunks_add_up_to_the_completion(runtime):
    params = SamplingParams(max_tokens=30, temperature=0)

    async def collect():
        return [chunk async for chunk in runtime.stream(HELLO, params)]

    chunks = run(collect())
    whole = run(runtime.complete(HELLO, params))
    assert "".join(c.text for c in chunks) == whole.text
    assert all(c.finish_reason is None for c in chunks[:-1])
    assert chunks[-1].finish_reason == whole.finish_reason
    assert "\ufffd" not in "".join(c.text for c in chunks[:-1]) or "\ufffd" in whole.text


def test_concurrent_requests_share_steps_and_match_sequential_results(runtime):
    prompts = [[{"role": "user", "content": f"request number {i} " * (i + 1)}] for i in range(4)]
    params = SamplingParams(max_tokens=20, temperature=0)
    alone = [run(runtime.complete(p, params)).text for p in prompts]

    async def together():
        runtime.steps = runtime.max_batch_seen = 0
        return await asyncio.gather(*(runtime.complete(p, params) for p in prompts))

    batched = run(together())
    assert [c.text for c in batched] == alone
    assert runtime.max_batch_seen >= 2  # several sequences advanced in one forward pass
    assert runtime.steps < sum(c.completion_tokens for c in batched)


def test_prompts_prefilled_in_separate_runs_still_decode_as_one_batch(runtime):
    # A long prompt is not padded into the short ones' prefill run; all three then share steps.
    prompts = [
        HELLO,
        [{"role": "user", "content": "a long question " * 60}],
        [{"role": "user", "content": "hi"}],
    ]
    lengths = [len(runtime.tokenizer.encode_chat(p)) for p in prompts]
    assert len(prefill_groups(lengths)) > 1
    params = SamplingParams(max_tokens=12, temperature=0)
    alone = [run(runtime.complete(p, params)).text for p in prompts]

    async def together():
        runtime.max_batch_seen = 0
        return await asyncio.gather(*(runtime.complete(p, params) for p in prompts))

    assert [c.text for c in run(together())] == alone
    assert runtime.max_batch_seen == len(prompts)


def test_abandoned_stream_frees_its_slot(runtime):
    async def take_two():
        stream = runtime.stream(HELLO, SamplingParams(max_tokens=200, temperature=0))
        got = [await stream.__anext__(), await stream.__anext__()]
        await stream.aclose()
        await until(
            lambda: not runtime.scheduler.running and not runtime.scheduler.waiting,
            30,
            "an idle runtime",
        )
        return got

    run(take_two())
    assert runtime.describe()["running"] == 0


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (
            lambda rt: (HELLO, SamplingParams(max_tokens=rt.context_length)),
            ContextLengthExceededError,
        ),
        (
            lambda rt: (
                [{"role": "user", "content": "word " * rt.context_length}],
                SamplingParams(),
            ),
            ContextLengthExceededError,
        ),
        (lambda rt: ([], SamplingParams()), EmptyInputError),
        (lambda rt: ([{"role": "wizard", "content": "hi"}], SamplingParams()), InvalidRequestError),
    ],
)
def test_bad_requests_raise_client_errors(runtime, make, error):
    messages, params = make(runtime)
    with pytest.raises(error) as info:
        run(runtime.complete(messages, params))
    assert info.value.status == 400


@pytest.mark.parametrize(
    "kwargs", [{"max_tokens": 0}, {"temperature": 2.5}, {"top_p": 0}, {"stop": ("a",) * 5}]
)
def test_sampling_params_are_validated(kwargs):
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**kwargs)
    assert info.value.param == next(iter(kwargs))


def test_steps_run_back_to_back_until_the_batch_changes(runtime):
    # One request alone never changes its batch: every token comes out of one executor round
    # trip (prefill + all decode steps), instead of one round trip per token.
    params = SamplingParams(max_tokens=30, temperature=0)
    expected = run(runtime.complete(HELLO, params))
    runtime.profile = StepProfile()
    again = run(runtime.complete(HELLO, params))
    assert again == expected
    assert runtime.profile.steps == again.completion_tokens + (again.finish_reason == "stop")
    assert runtime.profile.hops == 1
    assert 0 < runtime.profile.graph_s <= runtime.profile.step_s <= runtime.profile.wall_s


def test_a_request_arriving_mid_stream_joins_the_running_batch(runtime):
    # The engine thread must notice the waiting request and hand the batch back for admission,
    # not finish the running stream first.
    long_params = SamplingParams(max_tokens=120, temperature=0, seed=0)
    short_params = SamplingParams(max_tokens=3, temperature=0)

    async def scenario():
        finished: list[str] = []
        stream = runtime.stream(HELLO, long_params)
        await stream.__anext__()

        async def drain_long():
            async for _ in stream:
                pass
            finished.append("long")

        async def short():
            await runtime.complete(HELLO, short_params)
            finished.append("short")

        runtime.max_batch_seen = 0
        await asyncio.gather(drain_long(), short())
        return finished

    long_alone = run(runtime.complete(HELLO, long_params))
    order = run(scenario())
    assert long_alone.completion_tokens > 10  # long enough that the short one can overtake it
    assert order == ["short", "long"]
    assert runtime.max_batch_seen == 2


async def _until(condition, timeout_s: float = 30.0) -> None:
    await until(condition, timeout_s, "the runtime's thread")


def test_a_consumer_that_fell_behind_gets_what_was_generated_in_one_chunk(runtime, monkeypatch):
    params = SamplingParams(max_tokens=24, temperature=0, logprobs=True)
    whole = run(runtime.complete(HELLO, params))
    # Decode steps wait until the consumer holds the prefill's chunk: otherwise, on a busy
    # machine, the engine may finish before the event loop wakes the consumer at all.
    first_taken = threading.Event()
    step = runtime.runner.step

    def step_once_the_first_chunk_is_taken(admitted, running):
        if not admitted:
            assert first_taken.wait(timeout=30)
        return step(admitted, running)

    monkeypatch.setattr(runtime.runner, "step", step_once_the_first_chunk_is_taken)

    async def behind():
        stream = runtime.stream(HELLO, params)
        first = await stream.__anext__()
        first_taken.set()
        await _until(lambda: runtime.scheduler.idle)  # every token is generated and queued
        rest = [chunk async for chunk in stream]
        return [first, *rest]

    chunks = run(behind())
    assert len(chunks) == 2
    assert "".join(c.text for c in chunks) == whole.text
    assert chunks[1].finish_reason == whole.finish_reason
    assert chunks[1].completion_tokens == whole.completion_tokens
    assert sum(len(c.logprobs) for c in chunks) == len(whole.logprobs)
    assert tuple(lp for c in chunks for lp in c.logprobs) == whole.logprobs


def test_a_whole_answer_reaches_its_consumer_once_per_choice(runtime):
    params = SamplingParams(max_tokens=16, temperature=0.8, seed=3)
    two = GenerationOptions(n=2)

    async def collect():
        return [c async for c in runtime._generate(HELLO, params, two, None, streams=False)]

    chunks = run(collect())
    assert sorted(c.index for c in chunks) == [0, 1]
    assert all(c.finish_reason is not None for c in chunks)
    streamed = run(runtime.complete_choices(HELLO, params, two))
    assert [c.text for c in sorted(chunks, key=lambda c: c.index)] == [c.text for c in streamed]


def test_merged_chunks_keep_every_token_and_the_last_counts():
    calls = (ToolCall("c1", "f", "{}"),)
    one = GenerationChunk("a", None, 5, 1, logprobs=(TokenLogprob("a", b"a", -0.1),))
    two = GenerationChunk("b", None, 5, 2, tool_calls=calls)
    three = GenerationChunk("c", "stop", 5, 3, logprobs=(TokenLogprob("c", b"c", -0.3),))
    merged = merge_chunks([one, two, three])
    assert (merged.text, merged.finish_reason, merged.completion_tokens) == ("abc", "stop", 3)
    assert [lp.token for lp in merged.logprobs] == ["a", "c"] and merged.tool_calls == calls
    assert merge_chunks([two]) is two


def test_prompt_logprobs_are_the_exported_graphs_own(runtime, models_root):
    """What `echo` with `logprobs` shows, against a direct computation: the exported graph's
    logits for every prompt position in one run, each row's log-softmax at the next token."""
    from deployments.replica.engine.decoder import DecoderGraph
    from deployments.replica.engine.sampling import log_softmax
    from deployments.replica.engine.session import SessionConfig, open_session

    prompt_text = "Once upon a time in Paris, 北京"
    graph_path = runtime.model_dir / runtime.manifest.graph
    exported = DecoderGraph(
        open_session(graph_path, SessionConfig(provider="cpu")), runtime.manifest.llm.kv_cache
    )
    ids = runtime.tokenizer.encode_text(prompt_text)
    direct = log_softmax(exported.full_logits(ids))  # row i scores token i + 1
    params = SamplingParams(max_tokens=3, temperature=0, logprobs=True, prompt_logprobs=2)
    done = run(runtime.complete(prompt_text, params))
    scored = done.prompt_logprobs
    assert scored is not None and len(scored) == len(ids) == done.prompt_tokens
    assert scored[0].logprob is None and scored[0].top_logprobs == ()
    for position, (token, entry) in enumerate(zip(ids[1:], scored[1:], strict=True)):
        assert entry.logprob == pytest.approx(direct[position, token], abs=1e-4)
        best = sorted(range(direct.shape[1]), key=lambda t: -direct[position, t])[:2]
        assert [a.logprob for a in entry.top_logprobs] == pytest.approx(
            [direct[position, t] for t in best], abs=1e-4
        )
    # A character split across tokens shows as U+FFFD in each token's text, as OpenAI's do;
    # the bytes hold it whole.
    assert b"".join(entry.token_bytes for entry in scored) == prompt_text.encode()
    # Every choice of a stream carries them on its first chunk, and only there.
    chunks = run(_collect(runtime.stream(prompt_text, params, GenerationOptions(n=2))))
    firsts = {}
    for chunk in chunks:
        firsts.setdefault(chunk.index, chunk)
    assert all(first.prompt_logprobs == scored for first in firsts.values())
    assert all(c.prompt_logprobs is None for c in chunks if firsts[c.index] is not c)
    # Not asked, not computed.
    assert run(runtime.complete(prompt_text, SamplingParams(max_tokens=2))).prompt_logprobs is None


async def _collect(chunks):
    return [chunk async for chunk in chunks]


def test_describe_sums_the_engine_steps_a_request_took(runtime):
    """`describe()["engine"]`: the step profile a served replica reports (benchmarks.at_size
    .served_split reads it over a burst): steps, tokens and graph seconds, grown by a request."""
    before = runtime.describe()["engine"]
    out = run(runtime.complete(HELLO, SamplingParams(max_tokens=5, temperature=0)))
    after = runtime.describe()["engine"]
    assert set(after) == set(vars(StepProfile()))
    assert after["steps"] - before["steps"] >= out.completion_tokens
    assert after["tokens"] - before["tokens"] == out.completion_tokens
    assert 0 < after["graph_s"] - before["graph_s"] <= after["wall_s"] - before["wall_s"]
