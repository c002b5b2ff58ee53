"""LLMRuntime on a slot-cache model (a tiny fused GLM, `SlotStepRunner`): the same greedy tokens as
the plain graph of the same checkpoint, alone and in a batch whose sequences leave mid-run (a
slot moves), while a long prompt is prefilled in chunks (paced while others decode: both
layouts), after a stream is abandoned, beside a newcomer whose prefill fails (both layouts); and
the plain graph's runner refuses a slot-cache graph."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

import pytest
from fused_glm_fixtures import export_fused, tiny_glm_checkpoint

from deployments.contracts.sampling_params import SamplingParams
from deployments.errors import InternalServerError
from deployments.export.llm import export_llm
from deployments.replica.engine.decoder import DecoderGraph
from deployments.replica.engine.llm import LLMRuntime
from deployments.replica.engine.prefill_pacing import PrefillPacer
from deployments.replica.engine.session import SessionConfig, open_session
from deployments.replica.engine.slot_step_runner import SlotStepRunner
from tests.waiting import until

CHUNK = 16  # tokens per prefill chunk: the chat prompts below are longer, the raw ones shorter
SHORT = "Paris and 北京"
LONG = [{"role": "user", "content": "Tell me everything about the rivers of Beijing " * 3}]
MEDIUM = [{"role": "user", "content": "hi there"}]


def greedy(max_tokens: int, **kwargs) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, **kwargs)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    _, checkpoint = tiny_glm_checkpoint(tmp_path_factory.mktemp("tiny-glm"))
    root = tmp_path_factory.mktemp("models")
    export_fused(checkpoint, root / "fused")
    export_llm("glm", str(checkpoint), root / "plain")
    return root / "fused", root / "plain"


@pytest.fixture(scope="module")
def slots(model_dirs):
    rt = LLMRuntime(model_dirs[0], max_batch_size=2, prefill_chunk_tokens=CHUNK)
    rt.max_batch_size = 4  # raised after load, as a config change does: the slots grow
    yield rt
    rt.close()


@pytest.fixture(scope="module")
def plain(model_dirs):
    rt = LLMRuntime(model_dirs[1], max_batch_size=4)
    yield rt
    rt.close()


def run(coro):
    return asyncio.run(coro)


async def collect(stream) -> str:
    return "".join([chunk.text async for chunk in stream])


async def settled_slots(rt: LLMRuntime) -> int:
    """Once the scheduler is idle, read on the engine's thread after its last work: a finished
    sequence's last chunk reaches its consumer before its slot is given back."""
    await until(lambda: rt.scheduler.idle, 30, "an idle runtime")
    return await rt.runner.in_thread(lambda: rt.runner.active_slots)


T = TypeVar("T")


def run_and_settle(rt: LLMRuntime, work: Awaitable[T]) -> tuple[T, int]:
    """`work`'s result and the slots still in use once the runtime is idle, read on work's own
    loop: asyncio.run's end would cancel the scheduler as it gives a slot back."""

    async def both() -> tuple[T, int]:
        result = await work
        return result, await settled_slots(rt)

    return run(both())


def test_the_manifest_picks_the_slot_runner_and_the_prefix_cache_is_off(slots, plain):
    assert isinstance(slots.runner, SlotStepRunner)
    assert slots.describe()["prefix_cache"]["enabled"] is False
    assert plain.describe()["prefix_cache"]["max_bytes"] > 0
    with pytest.raises(ValueError, match="slot-cache model"):
        slots.graph  # noqa: B018 - the property raises


def test_greedy_completions_equal_the_plain_graphs(slots, plain):
    assert len(slots.tokenizer.encode_text(SHORT)) < CHUNK
    assert len(slots.tokenizer.encode_chat(LONG)) > 3 * CHUNK  # several chunks
    for prompt in (SHORT, MEDIUM, LONG):
        got, in_use = run_and_settle(slots, slots.complete(prompt, greedy(24)))
        expected = run(plain.complete(prompt, greedy(24)))
        assert (got.text, got.completion_tokens, got.finish_reason) == (
            expected.text,
            expected.completion_tokens,
            expected.finish_reason,
        )
        assert got.cached_tokens == 0 and in_use == 0


def test_concurrent_streams_leaving_mid_run_decode_as_each_alone(slots, monkeypatch):
    # The first leaves after 2 tokens while the long prompt is still going in (a slot move and
    # a swap), the second after 6 (a move), a fifth waits for a slot and is prefilled in
    # chunks while the others decode.
    requests = [
        (SHORT, greedy(2)),
        (MEDIUM, greedy(6)),
        (LONG, greedy(20)),
        ("Beijing", greedy(16)),
        (LONG, greedy(9, stop=("zzz",))),
    ]
    alone = [run(slots.complete(p, params)).text for p, params in requests]
    # Fixed chunks (as many as the prompt's length gives): paced ones would be as many as the
    # decode steps' timing gives (the pacing's own test is below).
    monkeypatch.setattr(slots.runner.pacer, "step_share", None)
    decoder = slots.runner.decoder
    moves: list[str] = []
    release, swap = decoder.release, decoder.swap

    def recorded_release(slot):
        moved = release(slot)
        moves.append("move" if moved is not None else "last")
        return moved

    def recorded_swap(a, b):
        moves.append("swap")
        swap(a, b)

    monkeypatch.setattr(decoder, "release", recorded_release)
    monkeypatch.setattr(decoder, "swap", recorded_swap)

    async def together():
        slots.max_batch_seen = 0
        return await asyncio.gather(*(collect(slots.stream(p, params)) for p, params in requests))

    texts, in_use = run_and_settle(slots, together())
    assert texts == alone
    assert "swap" in moves and moves.count("move") >= 2
    assert slots.max_batch_seen >= 3
    assert slots.runner.decoder.slots >= 4 and in_use == 0


def test_an_abandoned_stream_gives_its_slot_back(slots):
    async def take_two() -> int:
        stream = slots.stream(LONG, greedy(200))
        for _ in range(2):
            await stream.__anext__()
        await stream.aclose()
        # On the same event loop: asyncio.run's end would cancel the scheduler's loop while the
        # engine thread still steps, and its next hand-over to a closed loop would raise before
        # the slot is given back (a replica's loop never closes).
        return await settled_slots(slots)

    assert run(take_two()) == 0
    expected = run(slots.complete(MEDIUM, greedy(8))).text
    assert run(slots.complete(MEDIUM, greedy(8))).text == expected


@pytest.mark.parametrize("layout", ["slots", "plain"])
def test_a_prompt_whose_prefill_fails_fails_alone_and_the_running_streams_go_on(
    layout, request, monkeypatch
):
    """The graph fails on a newcomer's prompt (at size: one it could not allocate for) while two
    streams decode: the newcomer gets the error; the two give their caches back, are prefilled
    again with what they generated, and end with the tokens they would have alone."""
    rt: LLMRuntime = request.getfixturevalue(layout)
    poison = len(rt.tokenizer.encode_chat(LONG))
    streaming = [(SHORT, greedy(12)), (MEDIUM, greedy(12))]
    alone = [run(rt.complete(p, params)).text for p, params in streaming]
    prefill = rt.runner._prefill

    def failing_on_the_long_prompt(*args, **kwargs):
        # SlotStepRunner._prefill(loop, seq, size); DecoderStepRunner._prefill(admitted, size)
        newcomers = [args[1]] if layout == "slots" else args[0]
        if any(len(seq.context) >= poison for seq in newcomers):
            raise RuntimeError("Fail: could not allocate")
        return prefill(*args, **kwargs)

    monkeypatch.setattr(rt.runner, "_prefill", failing_on_the_long_prompt)

    async def together():
        streams = [rt.stream(p, params) for p, params in streaming]
        firsts = [(await stream.__anext__()).text for stream in streams]  # both decoding
        with pytest.raises(InternalServerError, match="RuntimeError"):
            await rt.complete(LONG, greedy(4))
        return [
            first + await collect(stream) for first, stream in zip(firsts, streams, strict=True)
        ]

    texts, in_use = run_and_settle(rt, together())
    assert texts == alone
    if layout == "slots":  # the plain graph's padded rows are only dropped at its next step
        assert in_use == 0


class ScriptedPacer(PrefillPacer):
    """Chunks of `paced` tokens while others decode (the sizing is test_prefill_pacing's)."""

    def __init__(self, largest: int, paced: int):
        super().__init__(largest, 1.0)
        self.paced = paced
        self.asked: list[bool] = []

    def next_chunk(self, *, others_decoding: bool) -> int:
        self.asked.append(others_decoding)
        return self.paced if others_decoding else self.largest


@pytest.mark.parametrize("layout", ["slots", "plain"])
def test_a_long_prompt_goes_in_paced_chunks_while_others_decode(layout, request, monkeypatch):
    """Alone, a long prompt goes in chunks of prefill_chunk_tokens; beside two decoding streams,
    in the pacer's chunks with a decode step of theirs between two; every answer as alone."""
    rt: LLMRuntime = request.getfixturevalue(layout)
    runner = rt.runner
    pacer = ScriptedPacer(CHUNK, paced=5)
    monkeypatch.setattr(runner, "pacer", pacer)
    assert len(rt.tokenizer.encode_chat(LONG)) > 3 * CHUNK
    if layout == "plain":  # computed each time, never found in the prefix cache
        kept = rt.prefix_cache.max_bytes
        rt.prefix_cache.resize(0)
        request.addfinalizer(lambda: rt.prefix_cache.resize(kept))
    pieces: list[int] = []
    if layout == "slots":
        decoder = runner.decoder
        extend = decoder.extend

        def recorded_extend(slot, tokens):
            pieces.append(len(tokens))
            return extend(slot, tokens)

        monkeypatch.setattr(decoder, "extend", recorded_extend)
    else:
        graph = runner.graph
        prefill_after = graph.prefill_after

        def recorded_prefill_after(caches, rests):
            pieces.append(len(rests[0]))
            return prefill_after(caches, rests)

        monkeypatch.setattr(graph, "prefill_after", recorded_prefill_after)
    expected = run(rt.complete(LONG, greedy(6))).text
    assert set(pacer.asked) == {False} and max(pieces) == CHUNK  # alone: chunks of the largest
    streaming = [(SHORT, greedy(40)), (MEDIUM, greedy(40))]
    alone = [run(rt.complete(p, params)).text for p, params in streaming]
    pieces.clear()
    pacer.asked.clear()

    async def together():
        streams = [rt.stream(p, params) for p, params in streaming]
        firsts = [(await stream.__anext__()).text for stream in streams]  # both decoding
        pieces.clear()  # their own prompts' pieces
        long = await rt.complete(LONG, greedy(6))
        rests = [await collect(stream) for stream in streams]
        return long.text, [first + rest for first, rest in zip(firsts, rests, strict=True)]

    (long_text, texts), _ = run_and_settle(rt, together())
    assert long_text == expected and texts == alone
    assert True in pacer.asked
    assert len(pieces) > 3 and max(pieces) <= 5 < CHUNK


def test_prompt_logprobs_equal_the_plain_graphs(slots, plain):
    params = greedy(2, prompt_logprobs=2)
    got = run(slots.complete(SHORT, params)).prompt_logprobs
    expected = run(plain.complete(SHORT, params)).prompt_logprobs
    assert got is not None and expected is not None and len(got) == len(expected)
    for mine, theirs in zip(got[1:], expected[1:], strict=True):
        assert mine.logprob == pytest.approx(theirs.logprob, abs=1e-4)
        assert [t.token for t in mine.top_logprobs] == [t.token for t in theirs.top_logprobs]


def test_the_plain_decoder_refuses_a_slot_cache_graph(slots):
    session = open_session(slots.model_dir / slots.manifest.graph, SessionConfig(provider="cpu"))
    with pytest.raises(ValueError, match="'slots'.*SlotDecoder"):
        DecoderGraph(session, slots.manifest.llm.kv_cache)
