"""Reading the router's answers: chat streams event by event (time to first token, tokens, an
error sent after the first byte) and the error text of a JSON body, for both APIs."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
from httpx_sse import ServerSentEvent

DONE = "[DONE]"
MAX_ERROR_CHARS = 300  # error text kept per request: enough to tell errors apart, CSV stays small


# A held stream (one that waited for a cold replica) sends the x-edge-* headers its response
# could not carry in a comment: `: edge x-edge-region=ap x-edge-cold-start=1 ...`.
EDGE_COMMENT = ": edge "


def edge_headers_of_comment(line: str) -> dict[str, str] | None:
    """The headers of a held stream's edge comment line, or None for any other line."""
    if not line.startswith(EDGE_COMMENT):
        return None
    pairs = (part.partition("=") for part in line[len(EDGE_COMMENT) :].split())
    return {name: value for name, _, value in pairs if name}


async def stream_items(
    response: httpx.Response,
) -> AsyncIterator[ServerSentEvent | dict[str, str]]:
    """A router stream's events (their data joined, as SSE defines) and, where it sends one,
    its edge comment's headers; other comments (`: warming ...`, pings) are skipped."""
    data: list[str] = []
    async for line in response.aiter_lines():
        if not line:
            if data:
                yield ServerSentEvent(data="\n".join(data))
            data = []
        elif line.startswith(":"):
            headers = edge_headers_of_comment(line)
            if headers is not None:
                yield headers
        elif line.startswith("data:"):
            data.append(line[len("data:") :].removeprefix(" "))
    if data:
        yield ServerSentEvent(data="\n".join(data))


class StreamTally:
    """Counts one chat stream. OpenAI chunks carry `choices[0].delta.content` (and, with
    `include_usage`, a last chunk with `usage`); Workers-AI events carry `response`. Errors after
    the first byte arrive as an event with `error` (OpenAI) or `success: false` (Workers AI)."""

    def __init__(self) -> None:
        self.first_token_s: float | None = None
        self.content_events = 0
        self.content_at_s: list[float] = []  # when each event with text arrived
        self.usage_tokens: int | None = None
        self.error: str | None = None
        self.done = False

    def add(self, event: ServerSentEvent, at_s: float) -> None:
        """Take one event that arrived at `at_s` (the caller's clock)."""
        data = event.data.strip()
        if not data:
            return
        if data == DONE:
            self.done = True
            return
        try:
            payload = json.loads(data)
        except json.JSONDecodeError:
            self.error = _clip(f"event is not JSON: {data}")
            return
        if not isinstance(payload, dict):
            self.error = _clip(f"event is not a JSON object: {data}")
            return
        error = error_text(payload)
        if error is not None:
            self.error = error
            return
        usage = payload.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage_tokens = usage["completion_tokens"]
        if _content(payload):
            self.content_events += 1
            self.content_at_s.append(at_s)
            if self.first_token_s is None:
                self.first_token_s = at_s

    def finish(self) -> None:
        """The stream closed: without `[DONE]` (and without an error event) it was cut short."""
        if not self.done and self.error is None:
            self.error = "stream ended before [DONE]"

    @property
    def tokens(self) -> int:
        """Completion tokens: the server's usage count when sent, else one per content event
        (a chunk may hold several tokens, e.g. while multi-byte characters complete)."""
        return self.usage_tokens if self.usage_tokens is not None else self.content_events


def _content(payload: dict[str, Any]) -> str:
    choices = payload.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        delta = choices[0].get("delta")
        content = delta.get("content") if isinstance(delta, dict) else None
        return content if isinstance(content, str) else ""
    response = payload.get("response")
    return response if isinstance(response, str) else ""


def error_text(payload: Any) -> str | None:
    """The message of an OpenAI error body or a failed Workers-AI envelope, else None."""
    if not isinstance(payload, dict):
        return None
    error = payload.get("error")
    if isinstance(error, dict):
        return _clip(str(error.get("message") or error))
    if payload.get("success") is False:
        errors = payload.get("errors")
        first = errors[0] if isinstance(errors, list) and errors else None
        message = first.get("message") if isinstance(first, dict) else first
        return _clip(str(message or "success: false"))
    return None


def body_error_text(body: bytes, status: int) -> str:
    """Why a non-2xx answer failed: the body's error message, else the start of the body."""
    try:
        message = error_text(json.loads(body))
    except (json.JSONDecodeError, UnicodeDecodeError):
        message = None
    if message is None:
        message = body.decode("utf-8", "replace").strip() or "(empty body)"
    return _clip(f"HTTP {status}: {message}")


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"
