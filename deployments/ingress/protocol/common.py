"""What every wire type shares: lenient request bases that record ignored fields, strict response
bases, token usage, id and timestamp helpers, and the UTF-8 and text-input checks."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Annotated, Any, ClassVar, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

CHAT_COMPLETION_ID_PREFIX = "chatcmpl"
MODERATION_ID_PREFIX = "modr"

# Error types of our own checks; the router maps them to the matching ServingError subclass.
INVALID_UTF8 = "invalid_utf8"
EMPTY_INPUT = "empty_input"
UNSUPPORTED_CONTENT = "unsupported_content"
UNSUPPORTED_VALUE = "unsupported_value"
UNSUPPORTED_PARAMETER = "unsupported_parameter"


def ensure_utf8(text: str) -> str:
    """`text` unchanged if it encodes as UTF-8. A JSON body may carry a lone surrogate
    ("\\ud800"), which decodes to a Python str that no tokenizer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise PydanticCustomError(
            INVALID_UTF8,
            "text is not valid UTF-8 (lone surrogate at character {position})",
            {"position": error.start},
        ) from None
    return text


Utf8Str = Annotated[str, AfterValidator(ensure_utf8)]


def check_text_inputs(value: Any, *, max_items: int) -> Any:
    """Validate an OpenAI-style `str | list[str]` text input in one place, so a bad input gets one
    clear error instead of one per union branch. Returns `value` unchanged. The messages leave out
    the field's name: the error's location carries it."""
    if isinstance(value, str):
        if not value:
            raise PydanticCustomError(EMPTY_INPUT, "must not be an empty string")
        ensure_utf8(value)
        return value
    if not isinstance(value, list):
        raise PydanticCustomError("string_type", "must be a string or a list of strings")
    if not value:
        raise PydanticCustomError(EMPTY_INPUT, "must not be an empty list")
    is_token_ids = all(isinstance(item, int) and not isinstance(item, bool) for item in value)
    if is_token_ids or all(isinstance(item, list) for item in value):
        raise PydanticCustomError(
            UNSUPPORTED_CONTENT,
            "token arrays are not supported: they are ids of another model's tokenizer "
            "(OpenAI's tiktoken), which mean nothing to ours; send the text itself (LangChain: "
            "OpenAIEmbeddings(..., check_embedding_ctx_length=False))",
        )
    if len(value) > max_items:
        raise PydanticCustomError(
            "too_long",
            "takes at most {max_items} strings, got {count}",
            {"max_items": max_items, "count": len(value)},
        )
    for index, text in enumerate(value):
        if not isinstance(text, str):
            raise PydanticCustomError(
                "string_type",
                "item {index} must be a string, got {kind}",
                {"index": index, "kind": type(text).__name__},
            )
        if not text:
            raise PydanticCustomError(EMPTY_INPUT, "item {index} is empty", {"index": index})
        try:
            ensure_utf8(text)
        except PydanticCustomError as error:
            raise PydanticCustomError(
                INVALID_UTF8, "item {index}: {reason}", {"index": index, "reason": error.message()}
            ) from None
    return value


def as_text_list(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


class LenientModel(BaseModel):
    """A request object that accepts and ignores fields it does not know (clients send many:
    `user`, `logit_bias`, `frequency_penalty`...) and remembers their names. As in OpenAI's API,
    an optional field sent as null means "not given": its default applies."""

    # Strict like OpenAI: `"max_tokens": true` or `"stream": "yes"` is an error, not a coercion.
    model_config = ConfigDict(extra="ignore", strict=True)

    _ignored_here: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _record_unknown_fields(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        if not isinstance(data, Mapping):
            return handler(data)
        known: dict[str, str] = {}
        for name, field in cls.model_fields.items():
            known[name] = name
            if field.alias:
                known[field.alias] = name
        optional = {name for name, field in cls.model_fields.items() if not field.is_required()}
        given = {
            key: value
            for key, value in data.items()
            if not (value is None and known.get(key) in optional)
        }
        model = handler(given)
        model._ignored_here = tuple(sorted(str(key) for key in data if key not in known))
        return model

    def _ignored_paths(self, prefix: str) -> Iterator[str]:
        for name in self._ignored_here:
            yield f"{prefix}{name}"
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, LenientModel):
                yield from value._ignored_paths(f"{prefix}{name}.")
            elif isinstance(value, list):
                for index, item in enumerate(value):
                    if isinstance(item, LenientModel):
                        yield from item._ignored_paths(f"{prefix}{name}.{index}.")


class RequestOptions(LenientModel):
    """Workers AI's request `options`, sent in the body by its REST API and its OpenAI-compatible
    chat completions: `rejectIfBusy` fails the request at once (a 429, code 3040) rather than
    let it wait in a capacity queue."""

    reject_if_busy: bool = Field(default=False, alias="rejectIfBusy")


def rejects_if_busy(request: Any) -> bool:
    """Whether a request's `options` (a chat request's, a Workers AI input's) ask not to wait
    for capacity."""
    options = getattr(request, "options", None)
    return isinstance(options, RequestOptions) and options.reject_if_busy


def reject_unsupported(value: Any, info: ValidationInfo) -> Any:
    """A field validator for an OpenAI parameter we do not honour: any value but null (which
    means "not given") is a 400 naming it, never a silent drop."""
    raise PydanticCustomError(
        UNSUPPORTED_PARAMETER,
        "'{name}' is an OpenAI parameter this server does not support",
        {"name": info.field_name},
    )


class OpenAIRequest(LenientModel):
    """A top-level request body. `ignored_fields()` lists what was accepted but not used, nested
    ones as dotted paths ("messages.0.tool_calls"), so the router can log them."""

    def ignored_fields(self) -> list[str]:
        return sorted(self._ignored_paths(""))


class ResponseModel(BaseModel):
    """A body we build ourselves: a misspelt field is our bug, so it fails loudly. A field named
    in `omitted_when_none` is left out rather than written as null: the vendors' schemas have
    such a field as a value or nothing (a stream delta's `role`, an event's `usage`)."""

    model_config = ConfigDict(extra="forbid")
    omitted_when_none: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _omit_nones(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if self.omitted_when_none and isinstance(data, dict):
            for name in self.omitted_when_none:
                if name in data and data[name] is None:
                    del data[name]
        return data


class PromptTokensDetails(ResponseModel):
    cached_tokens: int = Field(ge=0)  # of prompt_tokens, read from the replica's prefix cache


class Usage(ResponseModel):
    omitted_when_none = frozenset({"prompt_tokens_details"})

    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)
    prompt_tokens_details: PromptTokensDetails | None = None

    @classmethod
    def from_counts(
        cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None
    ) -> Usage:
        """`cached_tokens`: of the prompt's tokens, those a chat model's prefix cache held (OpenAI's
        and Workers AI's `prompt_tokens_details.cached_tokens`); None leaves the details out."""
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=None
            if cached_tokens is None
            else PromptTokensDetails(cached_tokens=cached_tokens),
        )

    @property
    def cached_tokens(self) -> int:
        details = self.prompt_tokens_details
        return 0 if details is None else details.cached_tokens


def make_id(prefix: str, uuid_source: Callable[[], uuid.UUID] = uuid.uuid4) -> str:
    """`prefix-<32 hex>`, like OpenAI's ids; tests pass a seeded `uuid_source`."""
    return f"{prefix}-{uuid_source().hex}"


def chat_completion_id(uuid_source: Callable[[], uuid.UUID] = uuid.uuid4) -> str:
    return make_id(CHAT_COMPLETION_ID_PREFIX, uuid_source)


def moderation_id(uuid_source: Callable[[], uuid.UUID] = uuid.uuid4) -> str:
    return make_id(MODERATION_ID_PREFIX, uuid_source)


def created_timestamp(clock: Callable[[], float] = time.time) -> int:
    """Unix seconds, as OpenAI's `created` fields are."""
    return int(clock())


def json_ready(value: Any) -> Any:
    """A response model, or plain data holding some (in lists), as data a JSON encoder writes;
    anything else (dicts, numpy arrays) is left as it is."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    if isinstance(value, list):
        return [json_ready(item) for item in value]
    return value
