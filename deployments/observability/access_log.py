"""The structured access log: one JSON line per request, with the API key's id (never the key)
and no prompt text unless `log_prompts` is on."""

from __future__ import annotations

import hashlib
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from deployments.observability.jsonl import LineAppender, to_json_line
from deployments.observability.outcome import RequestOutcome

ACCESS_LOGGER_NAME = "edge.access"
# The id deployments.ingress.security.keys gives an unnamed key, so logs and rate limits agree.
KEY_ID_PREFIX = "key-"
KEY_ID_HEX_DIGITS = 8


def api_key_id(authorization: str | None) -> str | None:
    """A stable, non-reversible id for the key in an `Authorization: Bearer <key>` header: lets
    ops group a key's requests without the log holding a usable secret. The router replaces it
    with the authenticated key's id (named keys) once it knows it."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    secret = token.strip() if scheme.lower() == "bearer" else authorization.strip()
    if not secret:
        return None
    return KEY_ID_PREFIX + hashlib.sha256(secret.encode()).hexdigest()[:KEY_ID_HEX_DIGITS]


def access_log_record(
    outcome: RequestOutcome,
    *,
    request_id: str | None,
    key_id: str | None,
    trace_id: str | None = None,
    prompt: Any = None,
    log_prompts: bool = False,
    timestamp_s: float | None = None,
) -> dict[str, Any]:
    """The access-log line of one request. `prompt` (chat messages or input texts) is only
    included with `log_prompts`; nothing else in the record carries request text."""
    record: dict[str, Any] = {
        "ts": timestamp_s,
        "request_id": request_id,
        "key_id": key_id,
        "trace_id": trace_id,
        "endpoint": outcome.endpoint,
        "model": outcome.model,
        "status": outcome.status,
        "latency_ms": round(outcome.latency_s * 1000.0, 3),
        "stream": outcome.stream,
        "colo": outcome.colo,
        "region": outcome.region,
        "route_reason": outcome.route_reason,
        "failover": outcome.failover,
        "tried_colos": list(outcome.tried),
        "cold_start": outcome.cold_start_ms is not None,
        "cold_start_ms": outcome.cold_start_ms,
        "cache": outcome.cache,
        "ttft_ms": None if outcome.ttft_s is None else round(outcome.ttft_s * 1000.0, 3),
        "input_tokens": outcome.input_tokens,
        "output_tokens": outcome.output_tokens,
        "finish_reason": outcome.finish_reason,
        "flagged_categories": list(outcome.flagged_categories),
        "error_type": outcome.error_type,
    }
    if log_prompts and prompt is not None:
        record["prompt"] = prompt
    return record


class JsonLineFormatter(logging.Formatter):
    """A dict message becomes its JSON line; anything else {"message": ...}."""

    def format(self, record: logging.LogRecord) -> str:
        if isinstance(record.msg, dict):
            return to_json_line(record.msg)
        return to_json_line({"message": record.getMessage(), "level": record.levelname})


class JsonLinesFileHandler(logging.Handler):
    """Appends formatted records to a file shared with other processes (see LineAppender)."""

    def __init__(self, path: str | Path):
        super().__init__()
        self._file = LineAppender(path)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._file.append([self.format(record)])
        except (OSError, ValueError):
            self.handleError(record)

    def close(self) -> None:
        self._file.close()
        super().close()


def configure_access_logger(
    path: str | Path | None = None,
    stream: IO[str] | None = None,
    name: str = ACCESS_LOGGER_NAME,
) -> logging.Logger:
    """The access logger with one JSON-lines handler: a shared file when `path` is set, else
    `stream` (stderr, which Ray writes to the replica's log). Calling it again replaces the
    handler instead of adding a second one. It does not propagate: the lines stay pure JSON."""
    logger = logging.getLogger(name)
    for old in [h for h in logger.handlers if isinstance(h.formatter, JsonLineFormatter)]:
        logger.removeHandler(old)
        old.close()
    handler: logging.Handler = (
        JsonLinesFileHandler(path)
        if path is not None
        else logging.StreamHandler(stream if stream is not None else sys.stderr)
    )
    handler.setFormatter(JsonLineFormatter())
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


class AccessLog:
    """Writes access-log records to a logger; the wall clock is injected for tests."""

    def __init__(
        self,
        logger: logging.Logger,
        log_prompts: bool = False,
        wall_clock: Callable[[], float] = time.time,
    ):
        self.logger = logger
        self.log_prompts = log_prompts
        self._wall_clock = wall_clock

    def write(
        self,
        outcome: RequestOutcome,
        *,
        request_id: str | None,
        key_id: str | None,
        trace_id: str | None = None,
        prompt: Any = None,
    ) -> dict[str, Any]:
        record = access_log_record(
            outcome,
            request_id=request_id,
            key_id=key_id,
            trace_id=trace_id,
            prompt=prompt,
            log_prompts=self.log_prompts,
            timestamp_s=round(self._wall_clock(), 6),
        )
        self.logger.info(record)
        return record
