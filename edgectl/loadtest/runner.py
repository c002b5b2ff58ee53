"""The open-loop sender: every request leaves at its scheduled time whether or not earlier ones
have answered, so a slow server shows up as latency instead of as a lower send rate."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx

from edge_sim.clock import Clock
from edgectl.loadtest.progress import NoProgress, ProgressView
from edgectl.loadtest.records import EdgeHeaders, ErrorKind, RequestRecord
from edgectl.loadtest.replicas import ReplicaSample, ReplicaSampler
from edgectl.loadtest.responses import StreamTally, body_error_text, stream_items
from edgectl.loadtest.scenarios import AdminAction, Arrival, Schedule
from edgectl.loadtest.workload import HttpRequest, WorkloadSettings, build_request

TICK_S = 0.5  # how often the progress line's phase and in-flight count refresh
DRAIN_GRACE_S = 1.0  # past the request timeout, before unfinished requests are cancelled


@dataclass(frozen=True)
class RunSettings:
    base_url: str
    request_timeout_s: float = 120.0  # the router's own default request timeout
    drain_timeout_s: float | None = None  # after the last send; None: request timeout + 1 s
    max_connections: int = 4096  # high, so the pool never holds a request back
    admin_key: str | None = None
    run_id: str = "loadgen"  # prefix of each request's x-request-id
    workload: WorkloadSettings = field(default_factory=WorkloadSettings)


@dataclass(frozen=True, slots=True)
class AdminEvent:
    """An admin call made during the run, and how the router answered it."""

    scheduled_s: float
    at_s: float
    label: str
    method: str
    colo: str
    status: int  # 0: no answer
    error: str


@dataclass(frozen=True)
class RunResult:
    schedule: Schedule
    records: tuple[RequestRecord, ...]  # in seq order
    admin_events: tuple[AdminEvent, ...]
    replica_samples: tuple[ReplicaSample, ...]
    replica_errors: tuple[str, ...]
    replica_error_count: int
    elapsed_s: float
    started_unix_s: float
    interrupted: bool = False  # cut short (Ctrl-C); the records hold what was measured


@dataclass
class _Outcome:
    """What one request has shown so far (filled in as the answer arrives)."""

    scheduled: float
    sent: float
    headers_at: float | None = None
    status: int = 0
    edge: EdgeHeaders = field(default_factory=EdgeHeaders)
    tally: StreamTally | None = None
    kind: ErrorKind = ""
    error: str = ""

    def fail(self, kind: ErrorKind, error: str) -> None:
        self.kind, self.error = kind, error

    def record(
        self, arrival: Arrival, request: HttpRequest, t0: float, done: float
    ) -> RequestRecord:
        def since_scheduled_ms(at: float | None) -> float | None:
            return None if at is None else (at - self.scheduled) * 1000

        tally = self.tally
        return RequestRecord(
            seq=arrival.seq,
            scheduled_s=arrival.at_s,
            sent_s=self.sent - t0,
            model=arrival.model.name,
            task=arrival.model.task,
            api=arrival.api,
            endpoint=request.endpoint,
            region=arrival.region.name,
            stream=request.stream,
            status=self.status,
            ok=self.kind == "",
            error_kind=self.kind,
            error=self.error,
            latency_ms=since_scheduled_ms(done),
            ttfb_ms=since_scheduled_ms(self.headers_at),
            ttft_ms=since_scheduled_ms(tally.first_token_s if tally else None),
            tokens=tally.tokens if tally else None,
            send_lag_ms=since_scheduled_ms(self.sent),
            edge=self.edge,
        )


class LoadRunner:
    """Runs one schedule against the router at `settings.base_url`.

    `transport` replaces the network (httpx.MockTransport in tests); `sampler`, when given, runs
    alongside and its replica samples come back in the result.
    """

    def __init__(
        self,
        settings: RunSettings,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        sampler: ReplicaSampler | None = None,
        progress: ProgressView | None = None,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
    ):
        self._settings = settings
        self._transport = transport
        self._sampler = sampler
        self._progress = progress or NoProgress()
        self._clock = clock
        self._wall_clock = wall_clock

    def run(self, schedule: Schedule) -> RunResult:
        return asyncio.run(self.run_async(schedule))

    async def run_async(self, schedule: Schedule) -> RunResult:
        settings = self._settings
        limits = httpx.Limits(
            max_connections=settings.max_connections,
            max_keepalive_connections=settings.max_connections,
        )
        # trust_env=False: a proxy from the environment must not sit between us and the router.
        client = httpx.AsyncClient(
            base_url=settings.base_url,
            transport=self._transport,
            limits=limits,
            timeout=httpx.Timeout(settings.request_timeout_s),
            trust_env=False,
        )
        records: list[RequestRecord] = []
        events: list[AdminEvent] = []
        started_unix_s = self._wall_clock()
        t0 = self._clock()
        if self._sampler is not None:
            self._sampler.start(t0)
        self._progress.begin(len(schedule.arrivals), schedule.end_s)
        interrupted = False
        try:
            async with client:
                ticker = asyncio.create_task(self._tick(schedule, t0, records))
                admin = asyncio.create_task(self._admin(client, schedule.actions, t0, events))
                try:
                    await self._dispatch(client, schedule, t0, records)
                    await self._sleep_until(t0 + schedule.end_s)
                    await admin
                except BaseException:
                    admin.cancel()  # its cleanup still clears a fault it set
                    await asyncio.gather(admin, return_exceptions=True)
                    raise
                finally:
                    ticker.cancel()
        except asyncio.CancelledError:
            # Ctrl-C (asyncio.run cancels this task): keep what was measured, so a cut-short
            # run still gets its report, marked as interrupted.
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
            interrupted = True
        finally:
            self._progress.end()
            if self._sampler is not None:
                self._sampler.stop()
        elapsed_s = self._clock() - t0
        samples = self._sampler.samples if self._sampler is not None else []
        return RunResult(
            schedule=schedule,
            records=tuple(sorted(records, key=lambda r: r.seq)),
            admin_events=tuple(events),
            replica_samples=tuple(samples),
            replica_errors=tuple(self._sampler.recent_errors if self._sampler else ()),
            replica_error_count=self._sampler.error_count if self._sampler else 0,
            elapsed_s=elapsed_s,
            started_unix_s=started_unix_s,
            interrupted=interrupted,
        )

    async def _dispatch(
        self,
        client: httpx.AsyncClient,
        schedule: Schedule,
        t0: float,
        records: list[RequestRecord],
    ) -> None:
        tasks: list[asyncio.Task[None]] = []
        try:
            for arrival in schedule.arrivals:
                await self._sleep_until(t0 + arrival.at_s)
                # A task per request, never awaited here: the next send does not wait for it.
                tasks.append(asyncio.create_task(self._send(client, arrival, t0, records)))
                self._progress.sent()
            drain_s = self._settings.drain_timeout_s
            if drain_s is None:  # each request ends itself at its deadline; this is a backstop
                drain_s = self._settings.request_timeout_s + DRAIN_GRACE_S
            if tasks:
                await asyncio.wait(tasks, timeout=drain_s)
        finally:
            # Still running at the end (or the run was interrupted): recorded as cancelled.
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            # A failure the sender does not classify is a bug of ours: stop, don't hide it.
            if isinstance(result, Exception):
                raise result

    async def _send(
        self,
        client: httpx.AsyncClient,
        arrival: Arrival,
        t0: float,
        records: list[RequestRecord],
    ) -> None:
        request = build_request(arrival, self._settings.workload, self._settings.run_id)
        outcome = _Outcome(scheduled=t0 + arrival.at_s, sent=self._clock())
        try:
            # A deadline for the whole request: httpx's timeouts are per read, so a stream that
            # trickles events would otherwise never time out.
            async with (
                asyncio.timeout(self._settings.request_timeout_s),
                client.stream(
                    request.method, request.path, json=request.body, headers=request.headers
                ) as response,
            ):
                outcome.headers_at = self._clock()
                outcome.status = response.status_code
                outcome.edge = EdgeHeaders.parse(response.headers)
                content_type = response.headers.get("content-type", "")
                if not response.is_success:
                    outcome.fail("http", body_error_text(await response.aread(), outcome.status))
                elif request.stream and content_type.startswith("text/event-stream"):
                    tally = outcome.tally = StreamTally()
                    async for item in stream_items(response):
                        if isinstance(item, dict):  # a held stream's x-edge-* headers
                            headers = httpx.Headers(response.headers)
                            headers.update(item)
                            outcome.edge = EdgeHeaders.parse(headers)
                        else:
                            tally.add(item, self._clock())
                    tally.finish()
                    if tally.error is not None:
                        outcome.fail("stream", tally.error)
                else:
                    await response.aread()
        except (TimeoutError, httpx.TimeoutException):
            outcome.fail("timeout", f"not done within {self._settings.request_timeout_s:g} s")
        except httpx.HTTPError as exc:
            outcome.fail("transport", f"{type(exc).__name__}: {exc}")
        except asyncio.CancelledError:
            outcome.fail("cancelled", "still running when the run ended")
            self._keep(outcome.record(arrival, request, t0, self._clock()), records)
            raise
        self._keep(outcome.record(arrival, request, t0, self._clock()), records)

    def _keep(self, record: RequestRecord, records: list[RequestRecord]) -> None:
        records.append(record)
        self._progress.finished(record)

    async def _admin(
        self,
        client: httpx.AsyncClient,
        actions: tuple[AdminAction, ...],
        t0: float,
        events: list[AdminEvent],
    ) -> None:
        faulted: dict[tuple[str, str], AdminAction] = {}  # (kind, target) -> what set it
        try:
            for action in actions:
                await self._sleep_until(t0 + action.at_s)
                event = await self._admin_call(client, action, t0)
                events.append(event)
                self._progress.note(
                    f"t={event.at_s:.1f}s {action.label} at {action.colo}: "
                    f"{event.status or 'no answer'} {event.error}".rstrip()
                )
                if 200 <= event.status < 300:
                    if action.method == "POST":
                        faulted[(action.kind, action.colo)] = action
                    else:
                        faulted.pop((action.kind, action.colo), None)
        finally:
            for _, set_by in sorted(faulted.items()):  # cut short: leave no fault behind
                cleanup = AdminAction(
                    self._clock() - t0,
                    "DELETE",
                    set_by.colo,
                    "fault cleared (early)",
                    kind=set_by.kind,
                )
                events.append(await self._admin_call(client, cleanup, t0))

    async def _admin_call(
        self, client: httpx.AsyncClient, action: AdminAction, t0: float
    ) -> AdminEvent:
        headers = {}
        if self._settings.admin_key:
            headers["authorization"] = f"Bearer {self._settings.admin_key}"
        at_s = self._clock() - t0
        try:
            response = await client.request(
                action.method, action.path, json=action.body, headers=headers
            )
            status = response.status_code
            error = "" if response.is_success else body_error_text(response.content, status)
        except httpx.HTTPError as exc:
            status, error = 0, f"{type(exc).__name__}: {exc}"
        return AdminEvent(
            action.at_s, at_s, action.label, action.method, action.colo, status, error
        )

    async def _tick(self, schedule: Schedule, t0: float, records: list[RequestRecord]) -> None:
        sent_before = 0
        while True:
            t_s = self._clock() - t0
            phase = schedule.phase_at(t_s)
            # Sent so far = arrivals due by now; finished = records; the difference is in flight.
            while (
                sent_before < len(schedule.arrivals) and schedule.arrivals[sent_before].at_s <= t_s
            ):
                sent_before += 1
            self._progress.tick(t_s, phase.name if phase else "drain", sent_before - len(records))
            await asyncio.sleep(TICK_S)

    async def _sleep_until(self, deadline: float) -> None:
        delay = deadline - self._clock()
        if delay > 0:
            await asyncio.sleep(delay)
