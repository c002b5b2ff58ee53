"""The write-behind queue against a fake store that is slow, down, or refuses a batch: the
request path's `offer` never waits or fails, the bound holds, drops are counted (metric and log
line), failed batches are retried in order and writing resumes by itself."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest

from deployments.config.state import LedgerConfig
from deployments.ingress.state.database import StoreUnavailable
from deployments.ingress.state.ledger import RequestLedger
from deployments.ingress.state.write_behind import DROP_LOG_EVERY_S, RecordWriter, WriterMetrics
from deployments.observability import InMemoryMetricsBackend


class FakeStore:
    """Takes batches while `up`; `gate` (when set) holds a write until released: a slow store."""

    def __init__(self) -> None:
        self.up = True
        self.refuse = False
        self.batches: list[list[int]] = []
        self.gate: asyncio.Event | None = None

    async def write(self, batch: Sequence[int]) -> None:
        if self.gate is not None:
            await self.gate.wait()
        if self.refuse:
            raise ValueError("a value the database refuses")
        if not self.up:
            raise StoreUnavailable("down")
        self.batches.append(list(batch))

    @property
    def written(self) -> list[int]:
        return [r for batch in self.batches for r in batch]


class ManualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def writer_for(
    store: FakeStore, clock: ManualClock | None = None, **config: float
) -> tuple[RecordWriter[int], InMemoryMetricsBackend, list[float]]:
    backend = InMemoryMetricsBackend()
    clock = clock or ManualClock()
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        """Time passes on the manual clock only."""
        slept.append(seconds)
        clock.now += seconds
        await asyncio.sleep(0)

    settings = {"queue_max_records": 5, "batch_max_records": 2, **config}
    writer = RecordWriter(
        store.write,
        LedgerConfig(**settings),  # type: ignore[arg-type]
        metrics=WriterMetrics(backend),
        clock=clock,
        sleep=sleep,
        log=logging.getLogger("test.write_behind"),
    )
    return writer, backend, slept


def total(backend: InMemoryMetricsBackend, name: str) -> float:
    return sum(value for value, _ in backend.metrics[name].points)


def test_records_are_written_in_order_in_batches():
    store = FakeStore()
    writer, backend, _ = writer_for(store)
    for record in range(5):
        assert writer.offer(record)
    asyncio.run(writer.flush_ready())
    assert store.batches == [[0, 1], [2, 3], [4]]
    assert writer.written == 5 and writer.held == 0
    assert total(backend, "edge_state_records_written_total") == 5


def test_a_down_store_keeps_records_up_to_the_bound_then_counts_drops(
    caplog: pytest.LogCaptureFixture,
):
    store = FakeStore()
    store.up = False
    clock = ManualClock()
    writer, backend, _ = writer_for(store, clock)
    with caplog.at_level(logging.WARNING, "test.write_behind"):
        accepted = [writer.offer(record) for record in range(8)]
        assert asyncio.run(writer.flush_once()) == 0  # failed: the batch is back in front
        assert not writer.offer(8)
    assert accepted == [True] * 5 + [False] * 3
    assert writer.held == 5 and writer.dropped == 4
    assert total(backend, "edge_state_records_dropped_total") == 4
    assert total(backend, "edge_state_write_failures_total") == 1
    drops = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert len(drops) == 1  # one line, not one per record
    clock.now += DROP_LOG_EVERY_S
    with caplog.at_level(logging.WARNING, "test.write_behind"):
        writer.offer(9)
    assert "4 records dropped since the last report, 5 in all" in caplog.records[-1].getMessage()

    store.up = True  # back: what was queued is written, in order, nothing else lost
    asyncio.run(writer.flush_ready())
    assert store.written == [0, 1, 2, 3, 4]
    assert writer.written + writer.dropped == 10


def test_the_batch_being_written_counts_towards_the_bound():
    """A slow store: while a batch waits on it, offers beyond the bound are dropped at once."""
    store = FakeStore()
    writer, _, _ = writer_for(store)

    async def scenario() -> list[bool]:
        store.gate = asyncio.Event()
        for record in range(4):
            writer.offer(record)
        flushing = asyncio.ensure_future(writer.flush_once())
        await asyncio.sleep(0)  # the batch [0, 1] is in flight, [2, 3] queued
        accepted = [writer.offer(record) for record in (4, 5)]
        store.gate.set()
        await flushing
        await writer.flush_ready()
        return accepted

    assert asyncio.run(scenario()) == [True, False]
    assert store.written == [0, 1, 2, 3, 4]


def test_retries_back_off_up_to_the_cap_and_reset_once_written():
    store = FakeStore()
    store.up = False
    writer, _, _ = writer_for(store, flush_interval_s=0.5, retry_max_s=3.0)
    writer.offer(1)
    delays = []
    for _ in range(5):
        asyncio.run(writer.flush_once())
        delays.append(writer.retry_delay_s())
    assert delays == [1.0, 2.0, 3.0, 3.0, 3.0]
    store.up = True
    asyncio.run(writer.flush_once())
    assert writer.retry_delay_s() == 0.5


def test_a_refused_batch_is_dropped_and_counted_not_retried_forever():
    store = FakeStore()
    writer, backend, _ = writer_for(store)
    for record in range(3):
        writer.offer(record)
    store.refuse = True
    asyncio.run(writer.flush_once())
    store.refuse = False
    asyncio.run(writer.flush_ready())
    assert store.written == [2]
    assert writer.dropped == 2 and total(backend, "edge_state_records_dropped_total") == 2


def test_close_writes_what_is_left_within_its_deadline():
    store = FakeStore()
    clock = ManualClock()
    writer, _, slept = writer_for(store, clock)
    for record in range(3):
        writer.offer(record)
    asyncio.run(writer.close(deadline_s=clock.now + 5))
    assert store.written == [0, 1, 2]

    store.up = False
    writer.offer(3)
    asyncio.run(writer.close(deadline_s=clock.now + 5))
    assert writer.held == 1  # the database never came back: given up at the deadline
    assert clock.now >= 5 and sum(slept) >= 5


def test_the_ledger_dates_each_record_by_its_own_utc_day_across_midnight() -> None:
    ledger = RequestLedger(writer=None, prices={})  # type: ignore[arg-type]
    midnight = 1_764_633_600.0  # 2025-12-02T00:00:00Z
    days = [ledger._day(t) for t in (midnight - 0.001, midnight, midnight + 86399.9, midnight)]
    assert days == ["2025-12-01", "2025-12-02", "2025-12-02", "2025-12-02"]
    assert ledger._day(midnight + 86400) == "2025-12-03"
