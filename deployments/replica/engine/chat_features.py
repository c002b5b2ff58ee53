"""How a chat request's features (n choices, tools, a response format) shape the model's text: the
grammar to apply, then tool calls parsed out of the text."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

from deployments.contracts.chat_features import ChatFeatures, function_of
from deployments.contracts.outputs import Completion, FinishReason, GenerationChunk, ToolCall
from deployments.contracts.sampling_params import GrammarSpec
from deployments.errors import InvalidRequestError
from deployments.replica.engine.tool_calls import ToolCallFormat, ToolCallStream


def grammar_of(features: ChatFeatures, fmt: ToolCallFormat) -> GrammarSpec | None:
    """The constraint these features put on the text, if any."""
    if features.forces_tool_call:
        if features.tool_choice == "required":
            return fmt.grammar(features.tools, features.parallel_tool_calls)
        chosen = [t for t in features.tools if function_of(t).get("name") == features.tool_choice]
        if not chosen:
            raise InvalidRequestError(
                f"tool_choice names {features.tool_choice!r}, which is not among the tools",
                param="tool_choice",
            )
        return fmt.grammar(chosen, parallel=False)
    kind = (features.response_format or {}).get("type", "text")
    if kind == "json_object":
        return GrammarSpec("json_schema", None)
    if kind == "json_schema":
        schema = (features.response_format or {}).get("json_schema", {}).get("schema")
        return GrammarSpec("json_schema", schema or {"type": "object"})
    return None


def with_tool_calls(done: Completion, fmt: ToolCallFormat, features: ChatFeatures) -> Completion:
    """A whole answer with its tool calls parsed out of the text."""
    if not features.parses_tool_calls:
        return done
    content, calls, finish = _split_calls(done.text, done.finish_reason, fmt, features)
    # A whole answer always has a reason: `finish` is it, or "tool_calls".
    return replace(
        done, text=content, tool_calls=tuple(calls), finish_reason=finish or done.finish_reason
    )


def _split_calls(
    text: str, finish_reason: FinishReason | None, fmt: ToolCallFormat, features: ChatFeatures
) -> tuple[str, list[ToolCall], FinishReason | None]:
    """(content, calls, finish_reason) of an answer's text. A forced call (`tool_choice`
    required or named) that `max_tokens` cut is still a call, as far as it came, with
    finish_reason `length` (OpenAI's answer): never its raw markup as content."""
    content, calls = fmt.parse(text, features.tool_names)
    if calls:
        return content, calls, "tool_calls"
    if features.forces_tool_call and finish_reason == "length":
        return "", fmt.parse_cut(text, features.tool_names), finish_reason
    return content, [], finish_reason


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
        rest, calls, finish = _split_calls(stream.finish(), chunk.finish_reason, fmt, features)
        yield replace(chunk, text=text + rest, tool_calls=tuple(calls), finish_reason=finish)
