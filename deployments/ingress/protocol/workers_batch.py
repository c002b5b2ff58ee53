"""Workers AI's asynchronous Batch API on the wire: a submission (`queueRequest`, `{"requests":
[...]}`), a poll (`{"request_id"}`), and the `result`s that answer them: a job's status while it
waits or runs, its items' responses once done (each with its index in `requests` as `id`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from deployments.errors import ServingError
from deployments.ingress.protocol.common import Usage
from deployments.ingress.protocol.workers_ai import error_envelope

QUEUE_REQUEST = "queueRequest"  # the REST query parameter; the binding's option, in the body
EXTERNAL_REFERENCE = "external_reference"
PendingStatus = Literal["queued", "running"]


def is_batch_request(body: Mapping[str, Any], queue_request: bool) -> bool:
    """A submission or a poll: `?queueRequest=true`, `queueRequest: true` in the body, or a
    body that is a bare `{"request_id"}` (Cloudflare polls with or without the parameter)."""
    return queue_request or body.get(QUEUE_REQUEST) is True or set(body) == {"request_id"}


def pending_result(status: PendingStatus, request_id: str, model: str) -> dict[str, Any]:
    return {"status": status, "request_id": request_id, "model": model}


def item_response(
    index: int, external_reference: Any, result: Any = None, error: ServingError | None = None
) -> dict[str, Any]:
    """One item's entry in `responses`: its `result`, or `success: false` and the `errors` a
    failed request's envelope carries."""
    if error is not None:
        failed = error_envelope(error)
        return {
            "id": index,
            "success": False,
            "errors": failed["errors"],
            EXTERNAL_REFERENCE: external_reference,
        }
    return {"id": index, "result": result, "success": True, EXTERNAL_REFERENCE: external_reference}


def done_result(
    responses: Sequence[dict[str, Any]], prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    usage = Usage.from_counts(prompt_tokens, completion_tokens)
    return {"responses": list(responses), "usage": usage.model_dump()}
