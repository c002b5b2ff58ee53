"""The chat engine's scheduler driven by a fake step runner, no graph: admission order and batch
size, cancellation, a failed step, prefill grouping, and that it loads no ONNX Runtime."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from deployments.errors import InternalServerError
from deployments.observability.timings import InferenceTimings
from deployments.replica.engine.scheduler import Scheduler, prefill_runs


@dataclass(eq=False)
class FakeSequence:
    name: str
    tokens_left: int
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    timings: InferenceTimings = field(default_factory=InferenceTimings)
    finished: bool = False
    cancelled: bool = False


@dataclass
class FakeRunner:
    """Each step takes one token from every sequence in the batch; records who was admitted
    into which call and the batch of every step."""

    admitted: list[list[str]] = field(default_factory=list)
    steps: list[list[str]] = field(default_factory=list)
    dropped: list[list[str]] = field(default_factory=list)
    fail_on_calls: tuple[int, ...] = ()  # which calls of `run` (from 1) fail
    before_step: object = None

    async def run(self, admitted, running, keeps_batch):
        self.admitted.append([s.name for s in admitted])
        batch = running + admitted
        if len(self.admitted) in self.fail_on_calls:
            # as a graph would: the running sequences were stepped, then the newcomers failed
            self.steps.append([s.name for s in running])
            raise RuntimeError("the graph failed")
        while True:
            if callable(self.before_step):
                self.before_step(self, batch)
            self.steps.append([s.name for s in batch])
            for seq in batch:
                seq.tokens_left -= 1
                seq.finished = seq.tokens_left == 0
                seq.queue.put_nowait(seq.name)
            await asyncio.sleep(0)
            if not keeps_batch(batch):
                return

    async def drop(self, sequences) -> None:
        self.dropped.append([s.name for s in sequences])


async def _drain(scheduler: Scheduler) -> None:
    while not scheduler.idle:
        await asyncio.sleep(0)


def test_sequences_are_admitted_oldest_first_while_the_batch_has_room():
    runner = FakeRunner()

    async def scenario():
        scheduler = Scheduler(runner, max_batch_size=2)
        a, b, c = FakeSequence("a", 3), FakeSequence("b", 1), FakeSequence("c", 2)
        scheduler.submit([a, b, c])
        await _drain(scheduler)
        return a, b, c

    a, b, c = asyncio.run(scenario())
    # b finishes after one step; c takes its slot at the next admission, beside a.
    assert runner.admitted == [["a", "b"], ["c"]]
    assert runner.steps == [["a", "b"], ["a", "c"], ["a", "c"]]
    assert all(s.finished and s.timings.admitted_at is not None for s in (a, b, c))


def test_a_waiting_sequence_ends_back_to_back_steps_when_a_slot_is_free():
    runner = FakeRunner()

    async def scenario():
        scheduler = Scheduler(runner, max_batch_size=2)
        late = FakeSequence("late", 1)

        def submit_after_first_step(fake, batch):
            if len(fake.steps) == 1:
                scheduler.waiting.append(late)

        runner.before_step = submit_after_first_step
        scheduler.submit([FakeSequence("long", 4)])
        await _drain(scheduler)

    asyncio.run(scenario())
    assert runner.admitted == [["long"], ["late"], []]
    assert runner.steps[:3] == [["long"], ["long"], ["long", "late"]]


def test_cancelled_sequences_leave_the_queue_and_the_batch():
    runner = FakeRunner()

    async def scenario():
        scheduler = Scheduler(runner, max_batch_size=1)
        first, second, third = (FakeSequence(n, 100) for n in ("first", "second", "third"))

        def cancel_after_two_steps(fake, batch):
            if len(fake.steps) == 2:
                Scheduler.cancel([first, second])

        runner.before_step = cancel_after_two_steps
        third.tokens_left = 1
        scheduler.submit([first, second, third])
        await _drain(scheduler)
        return scheduler

    scheduler = asyncio.run(scenario())
    # `second` was cancelled while waiting: never admitted.
    assert runner.admitted == [["first"], ["third"]]
    assert runner.steps == [["first"], ["first"], ["first"], ["third"]]
    assert scheduler.running == [] and not scheduler.waiting


def test_a_failed_step_fails_its_sequences_and_the_engine_goes_on():
    runner = FakeRunner(fail_on_calls=(1,))

    async def scenario():
        scheduler = Scheduler(runner, max_batch_size=1)
        failed, later = FakeSequence("failed", 5), FakeSequence("later", 1)
        scheduler.submit([failed, later])
        await _drain(scheduler)
        return failed, later

    failed, later = asyncio.run(scenario())
    assert failed.finished
    error = failed.queue.get_nowait()
    assert isinstance(error, InternalServerError)
    assert "RuntimeError" in error.message
    assert later.finished and later.queue.get_nowait() == "later"
    assert runner.admitted == [["failed"], ["later"]]


def test_a_newcomer_whose_run_fails_fails_alone_and_the_running_resume_from_a_new_prefill():
    """A prompt the graph cannot take (at size: one that asked for 25 GB) joins a running batch:
    it fails; the sequences that were decoding give their caches back and are prefilled again
    with what they generated, then go on to their last token."""
    runner = FakeRunner(fail_on_calls=(2,))

    async def scenario():
        scheduler = Scheduler(runner, max_batch_size=4)
        a, b = FakeSequence("a", 3), FakeSequence("b", 3)
        scheduler.submit([a, b])
        await asyncio.sleep(0)  # a and b take their first step
        huge = FakeSequence("huge", 5)
        scheduler.submit([huge])
        await _drain(scheduler)
        return a, b, huge

    a, b, huge = asyncio.run(scenario())
    error = huge.queue.get_nowait()
    assert isinstance(error, InternalServerError) and "RuntimeError" in error.message
    assert huge.queue.empty()
    assert runner.admitted == [["a", "b"], ["huge"], ["a", "b"]]
    assert runner.dropped == [["a", "b", "huge"]]
    for seq in (a, b):  # three tokens each, none lost, no error
        assert [seq.queue.get_nowait() for _ in range(3)] == [seq.name] * 3
        assert seq.finished and seq.queue.empty()


def test_a_run_that_fails_again_after_resuming_fails_the_resumed():
    runner = FakeRunner(fail_on_calls=(2, 3))  # the newcomer's run, then a's resumption

    async def scenario():
        scheduler = Scheduler(runner, max_batch_size=4)
        a = FakeSequence("a", 4)
        scheduler.submit([a])
        await asyncio.sleep(0)
        scheduler.submit([FakeSequence("huge", 5)])
        await _drain(scheduler)
        return a

    a = asyncio.run(scenario())
    assert runner.admitted == [["a"], ["huge"], ["a"]]
    tokens = [a.queue.get_nowait() for _ in range(a.queue.qsize())]
    assert tokens[:-1] == ["a"] * (len(tokens) - 1) and isinstance(tokens[-1], InternalServerError)
    assert a.finished


def test_batch_size_must_be_positive():
    with pytest.raises(ValueError, match="at least 1"):
        Scheduler(FakeRunner(), max_batch_size=0)


def test_prefill_runs_group_by_cached_prefix_then_the_fresh_by_padding():
    #        0    1    2    3    4    5
    lengths = [20, 30, 20, 30, 18, 400]
    cached = [10, None, 10, None, 10, None]
    runs = prefill_runs(lengths, cached)
    # On a cached prefix: one run per (cached length, rest length), first admitted first.
    assert runs[:2] == [[0, 2], [4]]
    # The fresh: the long one is not padded into the short ones' run.
    assert runs[2:] == [[1, 3], [5]]


def test_importing_the_scheduler_loads_no_onnx_runtime():
    code = "import sys, deployments.replica.engine.scheduler; print(' '.join(sys.modules))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.split()
    assert "deployments.replica.engine.scheduler" in loaded  # the check itself can see it
    assert "onnxruntime" not in loaded
    assert "deployments.replica.engine.decoder" not in loaded
