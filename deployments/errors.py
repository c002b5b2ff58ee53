"""One closed set of serving errors, each mapped to exactly one HTTP status and OpenAI error type.

The model runtimes raise these (they import nothing from Ray or HTTP). Each error carries its own
response headers (`response_headers`); the router's one exception handler shapes the body as the
route's API wants it (OpenAI's `to_error_body`, or a Workers-AI envelope, whose integer code per
failure kind is `ENVELOPE_CODES`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar


class ServingError(Exception):
    """Base of every error a client may see. Subclasses fix `status` and `error_type`."""

    status: ClassVar[int] = 500
    error_type: ClassVar[str] = "server_error"
    default_code: ClassVar[str | None] = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code or self.default_code

    def __reduce__(self) -> tuple[Any, ...]:
        # Errors cross Ray calls by pickle; keep param, code and retry hints, not just the message.
        return (_restore, (type(self), self.message, dict(self.__dict__)))

    def response_headers(self) -> dict[str, str]:
        """Headers the response must carry besides the body (Retry-After, Allow, ...)."""
        return {}

    def to_error_body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


class InvalidRequestError(ServingError):
    """The client's request is malformed or out of range (400)."""

    status = 400
    error_type = "invalid_request_error"


class EmptyInputError(InvalidRequestError):
    default_code = "empty_input"


class InvalidUTF8Error(InvalidRequestError):
    default_code = "invalid_utf8"


class BadHeaderValueError(InvalidRequestError):
    """A request header (e.g. x-client-geo) that cannot be parsed; `param` names the header."""

    default_code = "invalid_header"

    def __init__(self, message: str, *, header: str):
        super().__init__(f"invalid {header} header: {message}", param=header)


class UnsupportedParameterError(InvalidRequestError):
    """An OpenAI parameter we do not honour; `param` names it (OpenAI's own code for this)."""

    default_code = "unsupported_parameter"


class ContextLengthExceededError(InvalidRequestError):
    default_code = "context_length_exceeded"


class ContentPolicyViolationError(InvalidRequestError):
    """The moderation model flagged the request's input."""

    default_code = "content_policy_violation"


class WrongTaskError(InvalidRequestError):
    """E.g. an embeddings request naming a chat model."""

    default_code = "model_task_mismatch"


class AuthenticationError(ServingError):
    """Missing or wrong credentials (401)."""

    status = 401
    error_type = "authentication_error"
    default_code = "invalid_api_key"


class PermissionDeniedError(ServingError):
    """Valid credentials without the right to this route (403)."""

    status = 403
    error_type = "permission_error"
    default_code = "permission_denied"


class RateLimitedError(ServingError):
    """The key spent its request or token budget; `retry_after_s` says when it has enough again.
    Not an OverloadedError: the server is fine, this client is over its share."""

    status = 429
    error_type = "rate_limit_error"
    default_code = "rate_limit_exceeded"

    def __init__(
        self,
        message: str,
        *,
        retry_after_s: float = 1.0,
        headers: Mapping[str, str] | None = None,
        **kwargs: Any,
    ):
        super().__init__(message, **kwargs)
        self.retry_after_s = retry_after_s
        self.headers = dict(headers or {})

    def response_headers(self) -> dict[str, str]:
        """The x-ratelimit-* state plus Retry-After."""
        return {**self.headers, **retry_after(self.retry_after_s)}


class BudgetExceededError(RateLimitedError):
    """The key spent its budget for the period; `retry_after_s` runs to the period's end."""

    default_code = "budget_exceeded"


class NotFoundError(ServingError):
    """Something the request names does not exist (404); subclasses say what."""

    status = 404
    error_type = "not_found_error"
    default_code = "not_found"


class ModelNotFoundError(NotFoundError):
    default_code = "model_not_found"


class RouteNotFoundError(NotFoundError):
    """No route at this path (or the admin API, when no admin key is configured)."""

    default_code = "route_not_found"


class ColoNotFoundError(NotFoundError):
    default_code = "colo_not_found"


class RegionNotFoundError(NotFoundError):
    default_code = "region_not_found"


class KeyNotFoundError(NotFoundError):
    """No virtual key with this id (the admin API)."""

    default_code = "key_not_found"


class BatchNotFoundError(NotFoundError):
    """No batch job by that request id for this key (another key's job is not told apart)."""

    default_code = "batch_not_found"


class BatchExpiredError(ServingError):
    """A batch job whose results were kept `state.batch.result_ttl_s` and are gone now."""

    status = 410
    error_type = "invalid_request_error"
    default_code = "batch_expired"


class MethodNotAllowedError(ServingError):
    """The route exists, but not for this HTTP method (405); `allow` lists the methods it takes."""

    status = 405
    error_type = "invalid_request_error"
    default_code = "method_not_allowed"

    def __init__(self, message: str, *, allow: str | None = None, **kwargs: Any):
        super().__init__(message, **kwargs)
        self.allow = allow

    def response_headers(self) -> dict[str, str]:
        return {"allow": self.allow} if self.allow else {}


class PayloadTooLargeError(ServingError):
    status = 413
    error_type = "invalid_request_error"
    default_code = "payload_too_large"


class RetryLater:
    """For an error whose client should retry after `retry_after_s` (the Retry-After header)."""

    def __init__(self, message: str, *, retry_after_s: float = 1.0, **kwargs: Any):
        super().__init__(message, **kwargs)  # type: ignore[call-arg]  # ServingError's
        self.retry_after_s = retry_after_s

    def response_headers(self) -> dict[str, str]:
        return retry_after(self.retry_after_s)


class OverloadedError(RetryLater, ServingError):
    """No capacity right now; the client should retry after `retry_after_s`."""

    status = 503
    error_type = "overloaded_error"
    default_code = "overloaded"


class ModelNotReadyError(OverloadedError):
    """The model has no running replica and could not start one in time."""

    default_code = "model_not_ready"


class QueueFullError(OverloadedError):
    """Serve's back-pressure: the deployment's queue is at max_queued_requests. The edge spills
    to another region; it is never counted as a failure of the region."""

    default_code = "queue_full"


class RegionFaultError(OverloadedError):
    """A fault drill made this region's replica fail the request (raised in the replica)."""

    default_code = "region_fault"


class BusyError(RetryLater, ServingError):
    """The client asked not to wait in a capacity queue (Workers AI's `rejectIfBusy`) and no
    region has a free slot now: a 429 as Cloudflare answers it, not a wait."""

    status = 429
    error_type = "rate_limit_error"
    default_code = "capacity_exceeded"


class WaitBudgetExceededError(OverloadedError):
    """The request's wait budget (`x-edge-max-wait-ms`) ends before a replica could take it;
    `retry_after_s` is when the model is expected to be up."""

    default_code = "wait_budget_exceeded"


class StateUnavailableError(OverloadedError):
    """The gateway's database did not answer what this request needs from it (the admin API
    of keys and logs; a budgeted key's reservation with state.budget_when_store_down: refuse)."""

    default_code = "state_unavailable"


class BudgetUnverifiableError(StateUnavailableError):
    """A key with a budget whose request this router replica's lease of it cannot hold, while
    the database that could grant more does not answer: refused rather than overspent."""

    default_code = "budget_unverifiable"


class ControlUnavailableError(OverloadedError):
    """edge-control (the admin API's drills and region view) did not answer: it is restarting,
    or its node is gone. Serving requests never depends on it."""

    default_code = "control_unavailable"


class ModerationUnavailableError(OverloadedError):
    """The moderation gate's classifier failed on a direction that fails closed
    (security.moderation_gate.on_classifier_failure): the text could not be checked."""

    default_code = "moderation_unavailable"


class InternalServerError(ServingError):
    """A bug or an unexpected failure on our side; the message never carries a stack trace."""

    status = 500
    error_type = "server_error"
    default_code = "internal_error"


# The Workers AI envelope's `errors[].code` of each failure kind: an integer >= 1000, as
# Cloudflare's v4 envelope requires, and one per kind. Cloudflare's own code where it documents
# the same failure (developers.cloudflare.com/workers-ai/platform/errors: 5007, 3006, 3036, 3040;
# the v4 API's 7003 "no route" and 10000 "authentication error"); the 9xxx codes are ours.
# docs/api.md#error-codes lists them; tests keep this table whole, one-to-one and as documented.
ENVELOPE_CODES: Mapping[type[ServingError], int] = MappingProxyType(
    {
        ServingError: 9000,
        InternalServerError: 9001,
        InvalidRequestError: 9100,
        EmptyInputError: 9101,
        InvalidUTF8Error: 9102,
        BadHeaderValueError: 9103,
        UnsupportedParameterError: 9104,
        ContextLengthExceededError: 9105,
        ContentPolicyViolationError: 9106,
        WrongTaskError: 9107,
        AuthenticationError: 10000,
        PermissionDeniedError: 9200,
        RateLimitedError: 3036,
        BudgetExceededError: 9201,
        BusyError: 3040,
        NotFoundError: 9300,
        ModelNotFoundError: 5007,
        RouteNotFoundError: 7003,
        ColoNotFoundError: 9301,
        RegionNotFoundError: 9302,
        KeyNotFoundError: 9303,
        BatchNotFoundError: 9304,
        BatchExpiredError: 9310,
        MethodNotAllowedError: 9400,
        PayloadTooLargeError: 3006,
        OverloadedError: 9500,
        ModelNotReadyError: 9501,
        QueueFullError: 9502,
        RegionFaultError: 9503,
        WaitBudgetExceededError: 9504,
        StateUnavailableError: 9505,
        ControlUnavailableError: 9506,
        ModerationUnavailableError: 9507,
        BudgetUnverifiableError: 9508,
    }
)


def envelope_code(kind: type[ServingError]) -> int:
    """The envelope code of an error class (its nearest listed ancestor's, for one not listed)."""
    for cls in kind.__mro__:
        if cls in ENVELOPE_CODES:
            return ENVELOPE_CODES[cls]
    raise TypeError(f"{kind.__name__} is not a ServingError")


def retry_after(seconds: float) -> dict[str, str]:
    """Retry-After in whole seconds, as HTTP has it, at least 1 (a client reads 0 as "now"), and
    retry-after-ms, the same estimate to the millisecond (OpenAI's SDKs read it first)."""
    return {
        "retry-after": str(max(1, math.ceil(seconds))),
        "retry-after-ms": str(max(1, math.ceil(seconds * 1000))),
    }


def _restore(cls: type[ServingError], message: str, state: dict[str, Any]) -> ServingError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error
