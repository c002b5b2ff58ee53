"""What a chat request asks beyond sampling (n choices, tools, a response format) and how the
model's text becomes the answer: the grammar to apply, then tool calls parsed out of the text."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from deployments.errors import InvalidRequestError
from deployments.runtime.outputs import Completion, GenerationChunk
from deployments.runtime.sampling_params import GrammarSpec
from deployments.runtime.tool_calls import ToolCallFormat, ToolCallStream, function_of


@dataclass(frozen=True)
class ChatFeatures:
    """Plain data, so it crosses a Ray call. `tool_choice`: none, auto, required, or the name
    of the one function to call; `response_format`: OpenAI's object."""

    n: int = 1
    tools: tuple[Mapping[str, Any], ...] = ()
    tool_choice: str = "auto"
    parallel_tool_calls: bool = True
    response_format: Mapping[str, Any] | None = None
    raw: bool = False  # the last message's content is the whole prompt: no chat template

    @property
    def tool_names(self) -> list[str]:
        return [str(function_of(t).get("name")) for t in self.tools]

    @property
    def parses_tool_calls(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    def grammar(self, fmt: ToolCallFormat) -> GrammarSpec | None:
        """The constraint these features put on the text, if any."""
        if self.tools and self.tool_choice not in ("none", "auto"):
            if self.tool_choice == "required":
                return fmt.grammar(self.tools, self.parallel_tool_calls)
            chosen = [t for t in self.tools if function_of(t).get("name") == self.tool_choice]
            if not chosen:
                raise InvalidRequestError(
                    f"tool_choice names {self.tool_choice!r}, which is not among the tools",
                    param="tool_choice",
                )
            return fmt.grammar(chosen, parallel=False)
        kind = (self.response_format or {}).get("type", "text")
        if kind == "json_object":
            return GrammarSpec("json_schema", None)
        if kind == "json_schema":
            schema = (self.response_format or {}).get("json_schema", {}).get("schema")
            return GrammarSpec("json_schema", schema or {"type": "object"})
        return None


def with_tool_calls(done: Completion, fmt: ToolCallFormat, features: ChatFeatures) -> Completion:
    """A whole answer with its tool calls parsed out of the text."""
    if not features.parses_tool_calls:
        return done
    content, calls = fmt.parse(done.text, features.tool_names)
    if not calls:
        return done
    return replace(done, text=content, tool_calls=tuple(calls), finish_reason="tool_calls")


async def stream_with_tool_calls(
    chunks: AsyncIterator[GenerationChunk], fmt: ToolCallFormat, features: ChatFeatures
) -> AsyncIterator[GenerationChunk]:
    """Chunks whose text is content only; each choice's calls arrive with its last chunk."""
    if not features.parses_tool_calls:
        async for chunk in chunks:
            yield chunk
        return
    streams: dict[int, ToolCallStream] = {}
    async for chunk in chunks:
        stream = streams.setdefault(chunk.index, ToolCallStream(fmt, features.tool_names))
        text = stream.feed(chunk.text)
        if chunk.finish_reason is None:
            yield replace(chunk, text=text)
            continue
        rest, calls = stream.finish()
        finish = "tool_calls" if calls else chunk.finish_reason
        yield replace(chunk, text=text + rest, tool_calls=tuple(calls), finish_reason=finish)
