"""Write-behind: records leave the request path through a bounded in-memory queue and reach the
database in batches, from one background task per router replica.

The request path only appends (`offer`: no await, no I/O, never raises). While the database is
slow or down, records wait, the batch being written included, up to `queue_max_records`; a
record past that bound is dropped and counted (a metric, and a log line at most every
`DROP_LOG_EVERY_S`), never a failed request. A failed batch goes back to the front of the queue
and is tried again after a growing pause, so writing resumes by itself once the database
answers; `close` writes what is left within a deadline, at shutdown."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from deployments.config.state import LedgerConfig
from deployments.ingress.state.database import StoreUnavailable
from deployments.observability.metrics_backend import MetricsBackend

R = TypeVar("R")
DROP_LOG_EVERY_S = 10.0
METRIC_PREFIX = "edge_state_"

Sleep = Callable[[float], Awaitable[None]]


class WriterMetrics:
    """The writer's Prometheus view: records written and dropped, failed batches, queue depth."""

    def __init__(self, backend: MetricsBackend):
        self.written = backend.counter(
            METRIC_PREFIX + "records_written_total", "Ledger records written to the database", ()
        )
        self.dropped = backend.counter(
            METRIC_PREFIX + "records_dropped_total",
            "Ledger records dropped: the write-behind queue was full (database slow or down)",
            (),
        )
        self.failures = backend.counter(
            METRIC_PREFIX + "write_failures_total", "Batches the database did not take", ()
        )
        self.queued = backend.gauge(
            METRIC_PREFIX + "queued_records", "Ledger records waiting for the database", ()
        )


class RecordWriter(Generic[R]):
    def __init__(
        self,
        write: Callable[[Sequence[R]], Awaitable[None]],
        config: LedgerConfig,
        *,
        metrics: WriterMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        log: logging.Logger | None = None,
    ):
        self._write = write
        self._config = config
        self._metrics = metrics
        self._clock = clock
        self._sleep = sleep
        self._log = log or logging.getLogger("ray.serve")
        self._queue: deque[R] = deque()
        self._in_flight = 0  # records of the batch being written: they count towards the bound
        self.written = 0
        self.dropped = 0
        self.failed_batches = 0
        self._consecutive_failures = 0
        self._drops_unlogged = 0
        self._last_drop_log: float | None = None

    @property
    def held(self) -> int:
        """Records in memory, waiting or being written."""
        return len(self._queue) + self._in_flight

    def offer(self, record: R) -> bool:
        """Queue a record for the database; False (dropped, counted) when the queue is full."""
        if self.held >= self._config.queue_max_records:
            self._drop()
            return False
        self._queue.append(record)
        return True

    def _drop(self) -> None:
        self.dropped += 1
        self._drops_unlogged += 1
        if self._metrics is not None:
            self._metrics.dropped.inc(1, {})
        now = self._clock()
        if self._last_drop_log is None or now - self._last_drop_log >= DROP_LOG_EVERY_S:
            self._log.warning(
                "state: write-behind queue full (%d records, database slow or down): "
                "%d records dropped since the last report, %d in all",
                self._config.queue_max_records,
                self._drops_unlogged,
                self.dropped,
            )
            self._last_drop_log, self._drops_unlogged = now, 0

    async def flush_once(self) -> int:
        """Write one batch of the oldest records; how many were written (0 on failure: the
        batch is back at the front of the queue)."""
        size = min(len(self._queue), self._config.batch_max_records)
        if not size:
            return 0
        batch = [self._queue.popleft() for _ in range(size)]
        self._in_flight = size
        try:
            await self._write(batch)
        except StoreUnavailable as error:
            self._queue.extendleft(reversed(batch))
            self._failed(error)
            return 0
        except Exception:
            # Not the database being away but a batch it refuses (a bug): retrying would
            # refuse it forever, so it is dropped, counted and logged with its traceback.
            self._log.exception("state: the database refused a batch of %d records", size)
            self.dropped += size
            if self._metrics is not None:
                self._metrics.dropped.inc(size, {})
            return 0
        finally:
            self._in_flight = 0
            self._report_depth()
        self.written += size
        if self._metrics is not None:
            self._metrics.written.inc(size, {})
        if self._consecutive_failures:
            self._log.info(
                "state: the database takes records again after %d failed tries; %d queued",
                self._consecutive_failures,
                len(self._queue),
            )
            self._consecutive_failures = 0
        return size

    def _failed(self, error: StoreUnavailable) -> None:
        self.failed_batches += 1
        self._consecutive_failures += 1
        if self._metrics is not None:
            self._metrics.failures.inc(1, {})
        if self._consecutive_failures == 1:
            self._log.warning(
                "state: cannot write records (%s); %d queued, retrying", error, len(self._queue)
            )

    def _report_depth(self) -> None:
        if self._metrics is not None:
            self._metrics.queued.set(self.held, {})

    def retry_delay_s(self) -> float:
        """The pause before the next try: the flush interval, doubled per consecutive failure
        up to retry_max_s."""
        if not self._consecutive_failures:
            return self._config.flush_interval_s
        growth = self._config.flush_interval_s * 2.0 ** min(self._consecutive_failures, 30)
        return min(self._config.retry_max_s, growth)

    async def flush_ready(self) -> None:
        """Write batches until the queue is empty or a batch fails."""
        while self._queue and await self.flush_once():
            pass

    async def close(self, deadline_s: float) -> None:
        """At shutdown: write what is left, trying until `deadline_s` (this writer's clock)."""
        while self._queue and self._clock() < deadline_s:
            if not await self.flush_once():
                await self._sleep(min(self.retry_delay_s(), max(0.0, deadline_s - self._clock())))
        if self._queue:
            self._log.warning(
                "state: %d records not written at shutdown (the database did not answer)",
                len(self._queue),
            )
