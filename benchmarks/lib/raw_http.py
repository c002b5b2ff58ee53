"""A bare HTTP/1.1 client for bursts whose timing must be the server's, not the client's: requests
encoded before the start, written on keep-alive connections opened (and used once) beforehand,
each answer read by asyncio's stream reader alone. httpx costs about half a millisecond of the
client's one thread per answer; 32 answers landing together then stand in line on the client, and
the last is timed some 15 ms after it arrived. Here an answer costs tens of microseconds."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from benchmarks.lib.http_load import Clock


@dataclass(frozen=True)
class RawResponse:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes
    sent_at: float  # the clock as the request's first byte was written
    done_at: float  # the clock as its answer's last byte was read

    @property
    def latency_s(self) -> float:
        return self.done_at - self.sent_at

    def json(self) -> Any:
        return json.loads(self.body)


def encode(
    method: str, url: str, headers: Mapping[str, str], body: Mapping[str, Any] | None = None
) -> bytes:
    """The whole request as bytes, for a keep-alive connection: `body` (if any) as JSON."""
    parts = urlsplit(url)
    payload = b"" if body is None else json.dumps(body).encode()
    lines = [
        f"{method} {parts.path or '/'}{'?' + parts.query if parts.query else ''} HTTP/1.1",
        f"host: {parts.netloc}",
        *(["content-type: application/json"] if body is not None else []),
        f"content-length: {len(payload)}",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


class RawConnection:
    """One keep-alive connection; one request at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._reader, self._writer = reader, writer

    @classmethod
    async def open(cls, url: str) -> RawConnection:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"a plain http:// URL with a host is needed, got {url!r}")
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
        return cls(reader, writer)

    async def exchange(self, request: bytes, clock: Clock) -> RawResponse:
        sent_at = clock()
        self._writer.write(request)
        head = await self._reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in header_lines:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = await self._chunked_body()
        else:
            body = await self._reader.readexactly(int(headers.get("content-length", "0")))
        done_at = clock()
        return RawResponse(int(status_line.split(" ", 2)[1]), headers, body, sent_at, done_at)

    async def _chunked_body(self) -> bytes:
        body = bytearray()
        while True:
            size = int((await self._reader.readuntil(b"\r\n")).split(b";")[0], 16)
            chunk = await self._reader.readexactly(size + 2)  # the chunk and its CRLF
            if size == 0:
                return bytes(body)
            body += chunk[:-2]

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError):  # the server closed it first
            await self._writer.wait_closed()
