"""The scheduler under a KV budget, driven by a fake step runner that holds a byte per cached
position: admission waits for memory and runs when it frees, a request that can never fit or
waits too long is refused with a 503 and Retry-After, the newest arrival is preempted when the
running ones outgrow the budget and resumes with its tokens, and the budget holds at every step.
Also the budget's own checks against the host and the model."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from deployments.contracts.manifest import KVCacheLayout
from deployments.errors import OverloadedError
from deployments.observability.timings import InferenceTimings
from deployments.replica.engine.kv_budget import (
    KVBudget,
    bytes_per_position,
    check_limit,
)
from deployments.replica.engine.scheduler import Scheduler


@dataclass(eq=False)
class SizedSequence:
    name: str
    prompt: int  # positions
    tokens_left: int
    generated: int = 0
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    timings: InferenceTimings = field(default_factory=InferenceTimings)
    finished: bool = False
    cancelled: bool = False


@dataclass
class MemoryRunner:
    """Each step gives every sequence in the batch a token, and so a position. Records who was
    admitted and dropped, and the bytes the batch held after every step."""

    admitted: list[list[str]] = field(default_factory=list)
    dropped: list[list[str]] = field(default_factory=list)
    held: list[int] = field(default_factory=list)
    before_step: object = None

    @staticmethod
    def kv_bytes(running, admitted) -> int:
        # Each holds its prompt and generated tokens once it took its next token.
        return sum(s.prompt + s.generated + 1 for s in [*running, *admitted])

    async def drop(self, preempted) -> None:
        self.dropped.append([s.name for s in preempted])

    async def run(self, admitted, running, keeps_batch):
        self.admitted.append([s.name for s in admitted])
        batch = running + admitted
        while True:
            if callable(self.before_step):
                self.before_step(self, batch)
            for seq in batch:
                seq.generated += 1
                seq.tokens_left -= 1
                seq.finished = seq.tokens_left == 0
                seq.queue.put_nowait(seq.generated)
            self.held.append(sum(s.prompt + s.generated for s in batch))
            await asyncio.sleep(0)
            if not keeps_batch(batch):
                return


async def _drain(scheduler: Scheduler) -> None:
    while not scheduler.idle:
        await asyncio.sleep(0)


def _scheduler(runner: MemoryRunner, limit: int, **kwargs) -> Scheduler:
    return Scheduler(runner, max_batch_size=8, budget=KVBudget(limit), **kwargs)


def _items(seq: SizedSequence) -> list:
    return [seq.queue.get_nowait() for _ in range(seq.queue.qsize())]


def test_a_sequence_that_does_not_fit_waits_and_runs_when_memory_frees():
    runner = MemoryRunner()

    async def scenario():
        scheduler = _scheduler(runner, limit=14)
        a, b, c = SizedSequence("a", 4, 3), SizedSequence("b", 5, 2), SizedSequence("c", 6, 1)
        scheduler.submit([a, b, c])
        await _drain(scheduler)
        return scheduler, (a, b, c)

    scheduler, sequences = asyncio.run(scenario())
    # c (7 positions) waits while a and b hold 11..13; b's finish frees them.
    assert runner.admitted == [["a", "b"], ["c"]]
    assert max(runner.held) <= 14 and runner.dropped == []
    assert all(s.finished for s in sequences) and scheduler.budget.preemptions == 0


def test_a_request_bigger_than_the_budget_is_refused_with_retry_after():
    runner = MemoryRunner()

    async def scenario():
        scheduler = _scheduler(runner, limit=5)
        huge, small = SizedSequence("huge", 10, 1), SizedSequence("small", 2, 1)
        scheduler.submit([huge, small])
        await _drain(scheduler)
        return huge, small

    huge, small = asyncio.run(scenario())
    (error,) = _items(huge)
    assert isinstance(error, OverloadedError) and error.status == 503
    assert "does not fit" in error.message
    assert float(error.response_headers()["retry-after"]) >= 1
    assert _items(small) == [1] and runner.admitted == [["small"]]


def test_a_request_waiting_for_memory_past_the_bound_is_refused():
    runner = MemoryRunner()
    now = [0.0]

    async def scenario():
        scheduler = _scheduler(runner, limit=10, max_memory_wait_s=5, clock=lambda: now[0])
        hog, late = SizedSequence("hog", 2, 8), SizedSequence("late", 8, 1)

        def time_passes(fake, batch):
            now[0] += 1.0

        runner.before_step = time_passes
        scheduler.submit([hog, late])
        await _drain(scheduler)
        return hog, late

    hog, late = asyncio.run(scenario())
    (error,) = _items(late)
    assert isinstance(error, OverloadedError) and "5 s" in error.message
    assert runner.admitted[0] == ["hog"] and "late" not in sum(runner.admitted, [])
    assert hog.finished and len(_items(hog)) == 8


def test_the_newest_is_preempted_when_the_running_outgrow_the_budget_and_resumes():
    runner = MemoryRunner()

    async def scenario():
        scheduler = _scheduler(runner, limit=12)
        first, second = SizedSequence("first", 4, 6), SizedSequence("second", 4, 6)
        scheduler.submit([first, second])
        await _drain(scheduler)
        return scheduler, first, second

    scheduler, first, second = asyncio.run(scenario())
    # Two steps hold 12 positions; the third would hold 14: `second` gives its cache back,
    # waits for `first` to finish, and is admitted again with the 2 tokens it had.
    assert runner.dropped == [["second"]] and scheduler.budget.preemptions == 1
    assert runner.admitted == [["first", "second"], [], ["second"]]
    assert _items(first) == [1, 2, 3, 4, 5, 6]
    assert _items(second) == [1, 2, 3, 4, 5, 6]  # none lost, none twice
    assert max(runner.held) <= 12


def test_a_lone_sequence_outgrowing_a_lowered_budget_fails_with_retry_after():
    runner = MemoryRunner()

    async def scenario():
        scheduler = _scheduler(runner, limit=100)
        alone = SizedSequence("alone", 4, 10)

        def lower_after_two(fake, batch):
            if len(fake.held) == 2:
                scheduler.budget.limit_bytes = 6

        runner.before_step = lower_after_two
        scheduler.submit([alone])
        await _drain(scheduler)
        return alone

    alone = asyncio.run(scenario())
    items = _items(alone)
    assert items[:3] == [1, 2, 3] and isinstance(items[-1], OverloadedError)
    assert runner.dropped == [["alone"]]


LAYOUT = KVCacheLayout(layout="slots", num_layers=18, num_kv_heads=2, key_head_dim=64,
                       value_head_dim=64)  # fmt: skip


def test_bytes_per_position_come_from_the_manifest():
    # The at-size GLM stand-in: 18 layers x 2 KV heads x (64 + 64) x 4 bytes.
    assert bytes_per_position(LAYOUT, 4) == 18_432


def test_a_budget_beyond_the_host_or_below_one_whole_context_is_refused_with_numbers():
    gib = 1 << 30
    check_limit(gib, longest_sequence_bytes=gib // 2, context_length=4096, host_bytes=8 * gib)
    with pytest.raises(ValueError, match=r"kv_budget_mb=16384 exceeds this host's memory \(8192"):
        check_limit(16 * gib, longest_sequence_bytes=1, context_length=4096, host_bytes=8 * gib)
    with pytest.raises(ValueError, match=r"4096 positions need 2048.0 MiB.*at least 2048"):
        check_limit(gib, longest_sequence_bytes=2 * gib, context_length=4096, host_bytes=8 * gib)
    with pytest.raises(ValueError, match="more than 0"):
        check_limit(0, longest_sequence_bytes=1, context_length=1, host_bytes=gib)
    budget = KVBudget()
    budget.set_limit(None, longest_sequence_bytes=gib, context_length=4096)
    assert budget.limit_bytes is None and budget.fits(10 * gib)
