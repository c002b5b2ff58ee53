"""Request limits checked by the router before any model call; each breach is a 400 whose `code`
names the limit and whose `param` names the field."""

from __future__ import annotations

from collections.abc import Sequence

from deployments.config.security import ParamRange, RequestLimits
from deployments.errors import InvalidRequestError, InvalidUTF8Error
from deployments.ingress.protocol import ChatCompletionRequest

TOO_MANY_MESSAGES = "too_many_messages"
INPUT_TOO_LONG = "input_too_long"
MAX_TOKENS_TOO_LARGE = "max_tokens_too_large"
TOO_MANY_INPUTS = "too_many_inputs"
PARAMETER_OUT_OF_RANGE = "parameter_out_of_range"


def check_utf8(text: str, param: str) -> None:
    """The protocol types already refuse lone surrogates; this covers text from anywhere else."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidUTF8Error(
            f"{param}: text is not valid UTF-8 (lone surrogate at character {error.start})",
            param=param,
        ) from None


def _check_range(value: float, allowed: ParamRange, param: str) -> None:
    if value not in allowed:
        raise InvalidRequestError(
            f"{param}={value} is outside the allowed range [{allowed.min}, {allowed.max}]",
            param=param,
            code=PARAMETER_OUT_OF_RANGE,
        )


def check_chat(request: ChatCompletionRequest, limits: RequestLimits) -> None:
    count = len(request.messages)
    if count > limits.max_messages:
        raise InvalidRequestError(
            f"{count} messages exceed the limit of {limits.max_messages} per request",
            param="messages",
            code=TOO_MANY_MESSAGES,
        )
    total_chars = 0
    for index, message in enumerate(request.messages):
        text = message.text
        check_utf8(text, f"messages.{index}.content")
        total_chars += len(text)
    if total_chars > limits.max_input_chars:
        raise InvalidRequestError(
            f"the messages hold {total_chars} characters; the limit is "
            f"{limits.max_input_chars} per request",
            param="messages",
            code=INPUT_TOO_LONG,
        )
    max_tokens = request.effective_max_tokens
    if max_tokens is not None and max_tokens > limits.max_completion_tokens:
        param = (
            "max_completion_tokens" if request.max_completion_tokens is not None else "max_tokens"
        )
        raise InvalidRequestError(
            f"{param}={max_tokens} exceeds the limit of {limits.max_completion_tokens}",
            param=param,
            code=MAX_TOKENS_TOO_LARGE,
        )
    _check_range(request.temperature, limits.temperature, "temperature")
    _check_range(request.top_p, limits.top_p, "top_p")


def check_texts(texts: Sequence[str], limits: RequestLimits, param: str = "input") -> None:
    """An embeddings or moderation batch: how many texts, how long each, valid UTF-8."""
    if len(texts) > limits.max_batch_items:
        raise InvalidRequestError(
            f"{len(texts)} inputs exceed the limit of {limits.max_batch_items} per request",
            param=param,
            code=TOO_MANY_INPUTS,
        )
    for index, text in enumerate(texts):
        where = f"{param}.{index}" if len(texts) > 1 else param
        check_utf8(text, where)
        if len(text) > limits.max_item_chars:
            raise InvalidRequestError(
                f"{where} has {len(text)} characters; the limit is {limits.max_item_chars}",
                param=where,
                code=INPUT_TOO_LONG,
            )
