"""Server-sent events of a generation: after the first byte an error can no longer change the
status, so it becomes the stream's last event, in the route's error shape, before `[DONE]`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

from sse_starlette import EventSourceResponse

from deployments.api.errors import ErrorBody
from deployments.api.responses import json_text
from deployments.edge.calls import as_serving_error

DONE = "[DONE]"
PING_S = 15


def event_stream(
    events: AsyncIterator[str], error_body: ErrorBody, headers: Mapping[str, str]
) -> EventSourceResponse:
    async def ending_well() -> AsyncIterator[str]:
        try:
            async for event in events:
                yield event
        except Exception as exc:  # noqa: BLE001 - after the first byte an error is an event
            yield json_text(error_body(as_serving_error(exc)))
        yield DONE

    return EventSourceResponse(ending_well(), ping=PING_S, headers=dict(headers))
