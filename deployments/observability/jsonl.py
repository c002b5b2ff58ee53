"""JSON lines shared by many processes: the span exporter behind `exporter: jsonl` and
EDGE_TRACES_FILE, and the appender the access log file uses too.

Router and model replicas append to one file. Each line goes out in one write() on an O_APPEND
descriptor while holding an flock, so lines of any length never interleave or tear."""

from __future__ import annotations

import fcntl
import json
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import format_span_id, format_trace_id

from deployments.observability.attributes import EDGE_PROCESS_ROLE


class LineAppender:
    """Appends whole lines to a file that other processes append to as well."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(
            self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644
        )
        self._lock = threading.Lock()  # threads of this process; flock covers the others

    def append(self, lines: Sequence[str]) -> None:
        """Write the lines (no newlines inside) at the end of the file, as one unit."""
        if not lines:
            return
        data = "".join(f"{line}\n" for line in lines).encode()
        with self._lock:
            if self._fd is None:
                raise ValueError(f"{self.path} is closed")
            # O_APPEND alone keeps a single write() whole on local file systems; the lock also
            # keeps a write the kernel splits (large, or on NFS) from interleaving with others.
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._fd, view) :]
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def to_json_line(record: Mapping[str, Any]) -> str:
    """One compact line; values JSON cannot hold (tuples aside) become strings."""
    return json.dumps(record, separators=(",", ":"), sort_keys=True, default=str)


def _plain(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    return {key: list(v) if isinstance(v, tuple) else v for key, v in (attributes or {}).items()}


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """A finished span as a flat dict: ids as lowercase hex, times in unix nanoseconds."""
    context = span.get_span_context()
    assert context is not None  # an SDK span always has one
    start, end = span.start_time or 0, span.end_time or 0
    resource = span.resource.attributes
    return {
        "trace_id": format_trace_id(context.trace_id),
        "span_id": format_span_id(context.span_id),
        "parent_span_id": format_span_id(span.parent.span_id) if span.parent else None,
        "name": span.name,
        "kind": span.kind.name,
        "start_time_unix_nano": start,
        "end_time_unix_nano": end,
        "duration_ms": round((end - start) / 1e6, 3),
        "status": span.status.status_code.name,
        "attributes": _plain(span.attributes),
        "events": [
            {"name": e.name, "time_unix_nano": e.timestamp, "attributes": _plain(e.attributes)}
            for e in span.events
        ],
        "service": resource.get("service.name"),
        "process_role": resource.get(EDGE_PROCESS_ROLE),
        "pid": resource.get("process.pid"),
    }


class JsonLinesSpanExporter(SpanExporter):
    """Appends one JSON object per finished span to `path`."""

    def __init__(self, path: str | Path):
        self._file = LineAppender(path)

    @property
    def path(self) -> Path:
        return self._file.path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            self._file.append([to_json_line(span_record(span)) for span in spans])
        except (OSError, ValueError):
            return SpanExportResult.FAILURE  # the SDK logs it; a full disk must not fail requests
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._file.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # every export is written through already
