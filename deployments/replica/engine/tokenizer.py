"""Chat prompts to token ids and back: the model's jinja chat template rendered like Hugging Face
does, special tokens that only the template can produce, and streaming detokenization.

No transformers import: a replica cold-starts with `tokenizers` and `jinja2` alone.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from deployments.contracts.manifest import ModelManifest
from deployments.errors import EmptyInputError, InvalidRequestError, InvalidUTF8Error
from deployments.replica.engine.byte_level import byte_level_table

ROLES = ("system", "developer", "user", "assistant", "tool")
# OpenAI's newer `developer` role is the system role under another name; chat templates of the
# open models only know `system`.
_ROLE_ALIASES = {"developer": "system"}

# Client text reaches the template as placeholders made of private-use characters, so whatever the
# client writes ("<|im_end|>" included) is encoded as plain text: only the template's own text can
# become special tokens. The template itself must not contain these characters (checked).
_HOLE_OPEN, _HOLE_CLOSE = "\ue000", "\ue001"
_HOLE_RE = re.compile(f"{_HOLE_OPEN}(\\d+){_HOLE_CLOSE}")


class ChatTokenizer:
    """One model's tokenizer and chat template, safe to share between threads."""

    def __init__(
        self,
        tokenizer_path: str | Path,
        chat_template: str,
        special_tokens: Mapping[str, int],
        eos_token_ids: Sequence[int],
    ):
        # Special-token strings are encoded as ordinary text: the only special tokens are those
        # the template put, split out by `_special_re` (one parse of the file, not a second copy
        # for clients' text: 0.25 s and 65 MB of a replica at a 150k vocabulary).
        self._tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self._tokenizer.encode_special_tokens = True
        for token, token_id in special_tokens.items():
            if self._tokenizer.token_to_id(token) != token_id:
                raise ValueError(
                    f"{tokenizer_path}: special token {token!r} has id "
                    f"{self._tokenizer.token_to_id(token)}, the manifest says {token_id}"
                )
        if _HOLE_OPEN in chat_template or _HOLE_CLOSE in chat_template:
            raise ValueError("the chat template uses private-use characters reserved for content")
        self.special_tokens: dict[str, int] = dict(special_tokens)
        self.eos_token_ids: frozenset[int] = frozenset(eos_token_ids)
        self._special_re = _alternation(special_tokens)
        self._template = _compile_template(chat_template)
        self._skipped_ids = frozenset(
            i for i, added in self._tokenizer.get_added_tokens_decoder().items() if added.special
        )
        self._token_bytes = byte_level_table(self._tokenizer)

    @classmethod
    def from_manifest(cls, model_dir: str | Path, manifest: ModelManifest) -> ChatTokenizer:
        if manifest.llm is None or manifest.tokenizer is None:
            raise ValueError(f"{manifest.name} is not a chat model with a tokenizer")
        return cls(
            Path(model_dir) / manifest.tokenizer,
            manifest.llm.chat_template,
            manifest.llm.special_tokens,
            manifest.llm.eos_token_ids,
        )

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """The prompt text, ending with the assistant's generation prompt."""
        parts, held = self._render_with_holes(messages, tools)
        return "".join(held[int(p)] if i % 2 else p for i, p in enumerate(parts))

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """Token ids of the rendered prompt; special tokens only where the template put them.
        `tools` (OpenAI function tools) are declared the way the template does it."""
        parts, held = self._render_with_holes(messages, tools)
        return self._encode_parts(
            (held[int(part)], False) if i % 2 else (part, True) for i, part in enumerate(parts)
        )

    def _encode_parts(self, parts: Iterable[tuple[str, bool]]) -> list[int]:
        """Token ids of (text, trusted) parts in order: special-token strings become their ids
        in trusted text only; plain text between two special tokens is encoded as one."""
        ids: list[int] = []
        pending: list[str] = []  # plain text waiting for the next special token

        def flush() -> None:
            text = "".join(pending)
            pending.clear()
            if text:
                ids.extend(self._tokenizer.encode(text, add_special_tokens=False).ids)

        for part, trusted in parts:
            start = 0
            for match in self._special_re.finditer(part) if trusted and self._special_re else ():
                pending.append(part[start : match.start()])
                flush()
                ids.append(self.special_tokens[match.group()])
                start = match.end()
            pending.append(part[start:])
        flush()
        return ids

    def encode_text(self, text: str) -> list[int]:
        """Token ids of client text outside any template (a raw prompt): never special."""
        _check_utf8(text, param="prompt")
        if not text:
            raise EmptyInputError("the prompt is empty", param="prompt")
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode(self, text: str) -> list[int]:
        """Token ids of trusted text (e.g. a rendered prompt): the manifest's special-token
        strings in it become their single ids. Use `encode_chat` for anything a client wrote."""
        _check_utf8(text, param=None)
        return self._encode_parts([(text, True)])

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int, skip_special_tokens: bool = True) -> bytes:
        """The UTF-8 bytes a token stands for (ids outside the vocabulary stand for nothing)."""
        if skip_special_tokens and token_id in self._skipped_ids:
            return b""
        if 0 <= token_id < len(self._token_bytes):
            return self._token_bytes[token_id]
        return b""

    def _render_with_holes(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> tuple[list[str], list[str]]:
        """The rendered template split as [template text, hole index, template text, ...] and the
        client strings the holes stand for."""
        held: list[str] = []

        def hold(text: str) -> str:
            if not text:
                return text  # templates test content for emptiness; keep "" falsy
            held.append(text)
            return f"{_HOLE_OPEN}{len(held) - 1}{_HOLE_CLOSE}"

        def hold_json(text: str) -> str:
            # A string the template prints with `tojson`: held already escaped, so the JSON
            # around it stays valid once the hole is filled.
            return hold(json.dumps(text, ensure_ascii=False)[1:-1])

        safe = [_sanitized(m, i, hold) for i, m in enumerate(_checked_list(messages))]

        def risky(key: str) -> bool:
            # Keys stay readable to the template (`tool['function']`) unless they could smuggle
            # a special token in.
            return bool(self._special_re and self._special_re.search(key))

        if tools is not None and (
            isinstance(tools, str | Mapping) or not isinstance(tools, Sequence)
        ):
            raise InvalidRequestError("tools must be a list of tool objects", param="tools")
        safe_tools = [_held_strings(t, hold_json, risky) for t in tools] if tools else None
        try:
            rendered = self._template.render(
                messages=safe, tools=safe_tools, add_generation_prompt=True
            )
        except _TemplateRaised as exc:
            raise InvalidRequestError(str(exc), param="messages") from exc
        return _HOLE_RE.split(rendered), held


class IncrementalDetokenizer:
    """Turns a stream of token ids into text as it becomes complete.

    Bytes of a character split across tokens are held back until the character is whole, so a
    stream never shows U+FFFD for a character that the next token completes.
    """

    def __init__(self, tokenizer: ChatTokenizer, skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """The text completed by this token ("" while a character is still partial)."""
        return self._utf8.decode(self._tokenizer.token_bytes(token_id, self._skip_special_tokens))

    def flush(self) -> str:
        """Whatever is left at the end of the stream (a dangling partial character -> U+FFFD)."""
        tail = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return tail


class _TemplateRaised(TemplateError):
    """`raise_exception(...)` called by a chat template: the conversation is not acceptable."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _compile_template(source: str) -> Any:
    # The environment Hugging Face's apply_chat_template uses, so real templates render the same.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.globals["raise_exception"] = _raise_exception
    env.filters["tojson"] = _tojson
    return env.from_string(source)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Hugging Face's own `tojson` (not Jinja's HTML-escaping one), which the templates expect.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _held_strings(value: Any, hold: Callable[[str], str], risky: Callable[[str], bool]) -> Any:
    """`value` with every string value, and every risky key, replaced by its hole."""
    if isinstance(value, str):
        _check_utf8(value, param="tools")
        return hold(value)
    if isinstance(value, Mapping):
        return {
            (hold(k) if risky(k) else k): _held_strings(v, hold, risky)
            for k, v in ((str(k), v) for k, v in value.items())
        }
    if isinstance(value, list | tuple):
        return [_held_strings(v, hold, risky) for v in value]
    return value


def _alternation(tokens: Mapping[str, int]) -> re.Pattern[str] | None:
    # Longest first: a token that prefixes another never wins (leftmost-longest, as tokenizers).
    if not tokens:
        return None
    return re.compile("|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True)))


def _checked_list(messages: Any) -> Sequence[Any]:
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Sequence):
        raise InvalidRequestError("messages must be a list of message objects", param="messages")
    if not messages:
        raise EmptyInputError("messages must contain at least one message", param="messages")
    return messages


def _sanitized(message: Any, index: int, hold: Callable[[str], str]) -> dict[str, Any]:
    """The message as the template sees it: a known role, text content, client strings held."""
    where = f"messages[{index}]"
    if not isinstance(message, Mapping):
        raise InvalidRequestError(
            f"{where} must be an object with role and content", param="messages"
        )
    role = message.get("role")
    if role not in ROLES:
        raise InvalidRequestError(
            f"{where}.role must be one of {', '.join(ROLES)}; got {role!r}", param="messages"
        )
    safe: dict[str, Any] = {
        "role": _ROLE_ALIASES.get(role, role),
        # An assistant turn that only called tools has no content.
        "content": hold(_content_text(_content_or_empty(message, role), where)),
    }
    tool_call_id = message.get("tool_call_id")
    if role == "tool" and tool_call_id is not None:
        if not isinstance(tool_call_id, str):
            raise InvalidRequestError(f"{where}.tool_call_id must be a string", param="messages")
        _check_utf8(tool_call_id, param="messages")
        safe["tool_call_id"] = hold(tool_call_id)
    tool_calls = message.get("tool_calls")
    if role == "assistant" and tool_calls:
        safe["tool_calls"] = _sanitized_tool_calls(tool_calls, where, hold)
    return safe


def _sanitized_tool_calls(calls: Any, where: str, hold: Callable[[str], str]) -> list[Any]:
    """An assistant's past calls as templates read them: id, type and function name/arguments,
    every string held (the templates print arguments as they are)."""
    if not isinstance(calls, Sequence) or isinstance(calls, str):
        raise InvalidRequestError(f"{where}.tool_calls must be a list", param="messages")
    safe = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not all(
            isinstance(function.get(k), str) for k in ("name", "arguments")
        ):
            raise InvalidRequestError(
                f"{where}.tool_calls[{j}] needs function.name and function.arguments strings",
                param="messages",
            )
        call_id = call.get("id") if isinstance(call.get("id"), str) else f"call_{j}"
        for text in (call_id, function["name"], function["arguments"]):
            _check_utf8(text, param="messages")
        safe.append(
            {
                "id": hold(call_id),
                "type": "function",
                "function": {
                    "name": hold(function["name"]),
                    "arguments": hold(function["arguments"]),
                },
            }
        )
    return safe


def _content_or_empty(message: Mapping[str, Any], role: str) -> Any:
    content = message.get("content")
    return "" if content is None and role == "assistant" else content


def _content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        _check_utf8(content, param="messages")
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise InvalidRequestError(
                    f"{where}.content[{j}]: only text parts are supported, got {kind!r}",
                    param="messages",
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise InvalidRequestError(
                    f"{where}.content[{j}].text must be a string", param="messages"
                )
            _check_utf8(text, param="messages")
            texts.append(text)
        # Joined with nothing, as the shipped templates render text parts.
        return "".join(texts)
    raise InvalidRequestError(
        f"{where}.content must be a string or a list of text parts; got {type(content).__name__}",
        param="messages",
    )


def _check_utf8(text: str, param: str | None) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates, e.g. from a JSON "\ud800" escape
        raise InvalidUTF8Error(
            f"text is not valid Unicode (unpaired surrogate at index {exc.start})", param=param
        ) from exc
