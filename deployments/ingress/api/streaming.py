"""Server-sent events of a generation: after the first byte an error can no longer change the
status, so it becomes the stream's last event, in the route's error shape, before `[DONE]`. A
stream whose first chunk waits for a cold replica starts at once and says so in comment lines."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import Any

from sse_starlette import EventSourceResponse, ServerSentEvent

from deployments.ingress.api.errors import ErrorBody
from deployments.ingress.api.responses import json_text
from deployments.ingress.edge.calls import as_serving_error
from deployments.ingress.edge.waiting import ColdStartNotice

DONE = "[DONE]"
PING_S = 15
WARMING_COMMENT_S = 1.0  # how often a held stream says it is still warming
# A held stream's comment with the x-edge-* headers its response could not carry
EDGE_COMMENT = "edge"

# A stream's events, and the headers its first chunk's answer carries (x-edge-*, x-ratelimit-*)
OpenedStream = tuple[AsyncIterator[str], Mapping[str, str]]


def event_stream(
    events: AsyncIterator[Any], error_body: ErrorBody, headers: Mapping[str, str]
) -> EventSourceResponse:
    async def ending_well() -> AsyncIterator[Any]:
        try:
            async for event in events:
                yield event
        except Exception as exc:  # noqa: BLE001 - after the first byte an error is an event
            yield json_text(error_body(as_serving_error(exc)))
        yield DONE

    return EventSourceResponse(ending_well(), ping=PING_S, headers=dict(headers))


async def held_event_stream(
    opening: Awaitable[OpenedStream],
    warming: ColdStartNotice,
    error_body: ErrorBody,
    headers: Mapping[str, str],
) -> EventSourceResponse:
    """The stream `opening` gives. If its first chunk comes (or it fails) before the edge waits
    for a cold replica (the request's `warming` event): the usual response, with its real
    status and headers. Once the edge waits on a cold region, the response starts at once and
    sends `: warming region=<region> ready-in-ms=<estimate>` comment lines until the first chunk,
    so a client can tell a cold start from a hang and when it should end; the `x-edge-*` headers
    it could not carry (where it was served was not known yet) follow in one comment,
    `: edge x-edge-region=ap x-edge-cold-start=1 ...`, and an error that comes after is the
    stream's last event."""
    opened = asyncio.ensure_future(opening)
    warmed = asyncio.ensure_future(warming.wait())
    try:
        await asyncio.wait({opened, warmed}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        opened.cancel()
        raise
    finally:
        warmed.cancel()
    if opened.done():
        events, answer_headers = opened.result()  # a failure here keeps its status
        return event_stream(events, error_body, {**answer_headers, **headers})

    async def held() -> AsyncIterator[Any]:
        try:
            while not opened.done():
                yield ServerSentEvent(comment=warming.describe())
                await asyncio.wait({opened}, timeout=WARMING_COMMENT_S)
        finally:
            opened.cancel()  # the client left while it waited: the dispatch stops (no-op once done)
        events, answer_headers = opened.result()
        yield ServerSentEvent(comment=edge_comment(answer_headers))
        async for event in events:
            yield event

    return event_stream(held(), error_body, headers)


def edge_comment(headers: Mapping[str, str]) -> str:
    """`edge name=value ...`: the x-edge-* headers of an answer, as one SSE comment's text."""
    pairs = [f"{name}={value}" for name, value in headers.items() if name.startswith("x-edge-")]
    return " ".join([EDGE_COMMENT, *pairs])
