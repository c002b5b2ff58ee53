"""One record per request (timing, routing headers, outcome) and the raw `requests.csv`."""

from __future__ import annotations

import csv
import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ErrorKind = Literal["", "http", "stream", "timeout", "transport", "cancelled"]
"""Why a request failed: "" (it did not), an HTTP error status, an error event or a cut stream
after a 200, no answer in time, a connection problem, or still running when the run ended."""

_TRUE = frozenset({"1", "true", "yes"})


@dataclass(frozen=True, slots=True)
class EdgeHeaders:
    """The router's `x-edge-*` answer headers (missing ones stay empty)."""

    colo: str = ""
    rtt_ms: float | None = None
    route_reason: str = ""  # nearest | warm | spillover | failover
    failover: tuple[str, ...] = ()  # colos tried, in order
    cache: str = ""  # HIT | JOINED | MISS
    cold_start: bool = False
    cold_start_ms: float | None = None
    request_id: str = ""

    @classmethod
    def parse(cls, headers: Mapping[str, str]) -> EdgeHeaders:
        """From case-insensitive headers (httpx.Headers); malformed numbers become None."""
        failover = headers.get("x-edge-failover", "")
        return cls(
            colo=headers.get("x-edge-colo", "").strip(),
            rtt_ms=_float(headers.get("x-edge-rtt-ms")),
            route_reason=headers.get("x-edge-route-reason", "").strip(),
            failover=tuple(part for part in re.split(r"[\s,;>]+", failover) if part),
            cache=headers.get("x-edge-cache", "").strip().upper(),
            cold_start=headers.get("x-edge-cold-start", "").strip().lower() in _TRUE,
            cold_start_ms=_float(headers.get("x-edge-cold-start-ms")),
            request_id=headers.get("x-request-id", "").strip(),
        )


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What happened to one scheduled request. Times are seconds since the run started; every
    `*_ms` latency counts from the SCHEDULED send time, so a server that slows the sender down
    still shows the wait (no coordinated omission). `send_lag_ms` is how late the send was."""

    seq: int
    scheduled_s: float
    sent_s: float  # when the request actually left
    model: str
    task: str
    api: str
    endpoint: str
    region: str
    stream: bool
    status: int  # HTTP status; 0 when no answer came
    ok: bool
    error_kind: ErrorKind
    error: str
    latency_ms: float | None  # until the last byte (or the failure)
    ttfb_ms: float | None  # until the answer's headers
    ttft_ms: float | None  # streams: until the first content event
    tokens: int | None  # streams: completion tokens
    send_lag_ms: float | None
    edge: EdgeHeaders = EdgeHeaders()

    @property
    def colo(self) -> str:
        return self.edge.colo

    @property
    def cold_start(self) -> bool:
        return self.edge.cold_start


CSV_COLUMNS: tuple[str, ...] = (
    *(f.name for f in dataclasses.fields(RequestRecord) if f.name != "edge"),
    *(f.name for f in dataclasses.fields(EdgeHeaders)),
)


def write_csv(records: Iterable[RequestRecord], path: Path) -> None:
    """One row per request in `seq` order; empty cells for unknown values, ';' joins failover."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS, lineterminator="\n")
        writer.writeheader()
        for record in sorted(records, key=lambda r: r.seq):
            row = {
                **{f.name: getattr(record, f.name) for f in dataclasses.fields(RequestRecord)},
                **{f.name: getattr(record.edge, f.name) for f in dataclasses.fields(EdgeHeaders)},
            }
            del row["edge"]
            writer.writerow({key: _cell(value) for key, value in row.items()})


def _cell(value: object) -> str | int:
    if value is None:
        return ""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, tuple):
        return ";".join(value)
    return value if isinstance(value, int) else str(value)


def _float(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if number == number else None  # NaN is as good as missing
