"""Tool calls in each model family's own format: the grammar that forces valid calls (for
`tool_choice` required or named) and the parsers that turn generated text back into calls.

GLM-4 (GLM-4-0414's template): a call is the function's name, a newline and its JSON arguments,
right after `<|assistant|>`; parallel calls repeat `<|assistant|>name\\n{...}`. A plain answer
starts with a newline instead. Kimi-K2: `<|tool_calls_section_begin|>` then per call
`<|tool_call_begin|>functions.{name}:{index}<|tool_call_argument_begin|>{json}<|tool_call_end|>`
and `<|tool_calls_section_end|>`; the call's id is `functions.{name}:{index}`.
"""

from __future__ import annotations

import json
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from deployments.contracts.chat_features import function_of
from deployments.contracts.outputs import ToolCall
from deployments.contracts.sampling_params import JSON_OPTIONS, GrammarSpec

_JSON = json.JSONDecoder()


def argument_schema(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON schema a call's arguments must match; always an object, as OpenAI requires."""
    parameters = function_of(tool).get("parameters") or {"type": "object", "properties": {}}
    return {**parameters, "x-guidance": dict(JSON_OPTIONS)}


class ToolCallFormat(ABC):
    """How one model family writes tool calls."""

    # Whether special tokens must stay in the text for the parser to see the calls.
    keeps_special_tokens = False
    # Text that starts the calls (a stream holds back anything that may be its beginning).
    start_marker = ""

    def __init__(self, special_tokens: Sequence[str] = ()) -> None:
        self._specials = frozenset(special_tokens)

    def literal(self, text: str) -> str:
        """`text` in a grammar: a special token by name where the vocabulary has it."""
        return text if text in self._specials else json.dumps(text)

    def grammar(
        self, tools: Sequence[Mapping[str, Any]], parallel: bool, param: str = "tool_choice"
    ) -> GrammarSpec:
        """Text that is one call (or, `parallel`, one or more) of these tools."""
        alternatives = [
            f"fn_{i}: {self._call_rule(function_of(tool)['name'], argument_schema(tool))}"
            for i, tool in enumerate(tools)
        ]
        call = "call: " + " | ".join(f"fn_{i}" for i in range(len(tools)))
        source = "\n".join([self._start(parallel), call, *alternatives])
        return GrammarSpec("lark", source, param, *self._ending)

    # The text after the last call, and the text that would start one more instead.
    _ending: tuple[str, str] = ("", "")

    @abstractmethod
    def _start(self, parallel: bool) -> str: ...

    @abstractmethod
    def _call_rule(self, name: str, schema: Mapping[str, Any]) -> str: ...

    @abstractmethod
    def parse(self, text: str, names: Sequence[str]) -> tuple[str, list[ToolCall]]:
        """(content, calls) of a whole answer; text that holds no valid call is all content."""

    @abstractmethod
    def parse_cut(self, text: str, names: Sequence[str]) -> list[ToolCall]:
        """The calls of a forced answer (`tool_choice` required or named) that `max_tokens` cut:
        the whole ones, then the last as far as it came (its name and the arguments' text so
        far), as OpenAI answers a call cut by `length`; none while the first name is not whole."""

    def might_call(self, head: str, names: Sequence[str]) -> bool | None:
        """Whether an answer beginning with `head` holds calls (None: cannot tell yet). By
        default calls may follow content: they start at `start_marker`."""
        return self.start_marker in head


class Glm4ToolCalls(ToolCallFormat):
    start_marker = ""  # a call starts with a tool name: decided on the first line
    separator = "<|assistant|>"
    keeps_special_tokens = True  # the separator between parallel calls
    # Nothing after the last call; the separator starts one more (the closing path keeps room
    # for it: without, a call begun 8 tokens from max_tokens was cut, needing 14).
    _ending = ("", separator)

    def _start(self, parallel: bool) -> str:
        return f"start: call ({self.literal(self.separator)} call)*" if parallel else "start: call"

    def _call_rule(self, name: str, schema: Mapping[str, Any]) -> str:
        return f"{json.dumps(name + chr(10))} %json{json.dumps(schema)}"

    def parse(self, text: str, names: Sequence[str]) -> tuple[str, list[ToolCall]]:
        calls: list[ToolCall] = []
        at = 0
        while at < len(text):
            if text.startswith(self.separator, at):
                at += len(self.separator)
            name, newline, _ = text[at:].partition("\n")
            if not newline or name not in names:
                return text, []
            try:
                arguments, end = _JSON.raw_decode(text, at + len(name) + 1)
            except json.JSONDecodeError:
                return text, []
            if not isinstance(arguments, dict):
                return text, []
            calls.append(ToolCall(f"call_{uuid.uuid4().hex[:24]}", name, json.dumps(arguments)))
            at = end
            while at < len(text) and text[at].isspace():
                at += 1
        return ("", calls) if calls else (text, [])

    def parse_cut(self, text: str, names: Sequence[str]) -> list[ToolCall]:
        calls = []
        for part in text.split(self.separator):
            name, newline, arguments = part.lstrip().partition("\n")
            if not newline or name not in names:
                break
            calls.append(ToolCall(f"call_{uuid.uuid4().hex[:24]}", name, arguments.strip()))
        return calls

    def might_call(self, head: str, names: Sequence[str]) -> bool | None:
        # A call starts the answer with a tool's name and a newline; text starts otherwise.
        first, newline, _ = head.partition("\n")
        if newline:
            return first in names
        return None if any(n.startswith(first) for n in names) else False


class KimiK2ToolCalls(ToolCallFormat):
    start_marker = "<|tool_calls_section_begin|>"
    end_marker = "<|tool_calls_section_end|>"
    _ending = (end_marker, "<|tool_call_begin|>")
    keeps_special_tokens = True  # a real Kimi vocabulary has the markers as special tokens
    _CALL = re.compile(
        r"<\|tool_call_begin\|>\s*(?P<id>[^<]+?)\s*<\|tool_call_argument_begin\|>\s*"
        r"(?P<arguments>.*?)\s*<\|tool_call_end\|>",
        re.DOTALL,
    )

    def _start(self, parallel: bool) -> str:
        calls = "call+" if parallel else "call"
        return f"start: {self.literal(self.start_marker)} {calls} {self.literal(self.end_marker)}"

    def _call_rule(self, name: str, schema: Mapping[str, Any]) -> str:
        return " ".join(
            [
                self.literal("<|tool_call_begin|>"),
                json.dumps(f"functions.{name}:"),
                "/[0-9]/",
                self.literal("<|tool_call_argument_begin|>"),
                f"%json{json.dumps(schema)}",
                self.literal("<|tool_call_end|>"),
            ]
        )

    def parse(self, text: str, names: Sequence[str]) -> tuple[str, list[ToolCall]]:
        content, marker, section = text.partition(self.start_marker)
        if not marker:
            return text, []
        calls = []
        for match in self._CALL.finditer(section):
            call_id = match["id"]
            name = call_id.split(".", 1)[-1].rsplit(":", 1)[0]
            if name not in names:
                continue
            calls.append(ToolCall(call_id, name, match["arguments"]))
        return (content, calls) if calls else (text, [])

    def parse_cut(self, text: str, names: Sequence[str]) -> list[ToolCall]:
        _, _, section = text.partition(self.start_marker)
        calls = []
        for part in section.split("<|tool_call_begin|>")[1:]:
            call_id, argument_begin, arguments = part.partition("<|tool_call_argument_begin|>")
            name = call_id.strip().split(".", 1)[-1].rsplit(":", 1)[0]
            if not argument_begin or name not in names:
                break
            arguments = arguments.split("<|tool_call_end|>", 1)[0]
            calls.append(ToolCall(call_id.strip(), name, arguments.strip()))
        return calls


TOOL_CALL_FORMATS: Mapping[str, type[ToolCallFormat]] = MappingProxyType(
    {"glm": Glm4ToolCalls, "kimi": KimiK2ToolCalls}
)


def tool_call_format(family: str, special_tokens: Sequence[str]) -> ToolCallFormat:
    try:
        return TOOL_CALL_FORMATS[family](special_tokens)
    except KeyError:
        raise ValueError(f"no tool-call format for the {family!r} family") from None


class ToolCallStream:
    """A stream's text, split as it comes into content to pass on now and what may be tool
    calls, held until the answer is complete (then parsed and sent as one delta per call)."""

    def __init__(self, fmt: ToolCallFormat, names: Sequence[str]) -> None:
        self._fmt = fmt
        self._names = list(names)
        self._held = ""
        self._calling: bool | None = None  # None: not decided yet

    def feed(self, text: str) -> str:
        """The content that is safe to pass on after `text`."""
        self._held += text
        if self._calling is None:
            self._calling = self._fmt.might_call(self._held, self._names)
        if self._calling is not False:
            return ""
        out, self._held = self._split_safe(self._held)
        return out

    def finish(self) -> str:
        """The text still held (content, calls or both: the whole answer's parse says)."""
        held, self._held = self._held, ""
        return held

    def _split_safe(self, text: str) -> tuple[str, str]:
        marker = self._fmt.start_marker
        if not marker:
            return text, ""
        at = text.find(marker)
        if at >= 0:
            self._calling = True
            return text[:at], text[at:]
        for keep in range(min(len(marker) - 1, len(text)), 0, -1):
            if marker.startswith(text[-keep:]):
                return text[:-keep], text[-keep:]
        return text, ""
