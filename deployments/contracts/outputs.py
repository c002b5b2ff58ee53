"""What a generation returns: the chunks of a stream, whole completions, their logprobs, tool
calls and finish reasons.

Plain frozen dataclasses with no numpy or ONNX Runtime behind them (vLLM's `outputs.py`): the
router imports these to read a replica's answers and must not load the engine that makes them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

FinishReason = Literal["stop", "length", "content_filter", "tool_calls"]


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token as OpenAI's logprobs describe it, and its most likely alternatives."""

    token: str
    token_bytes: bytes
    logprob: float
    top_logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class PromptTokenLogprob:
    """A prompt token and its logprob given the tokens before it (none for the first: nothing
    precedes it), with the most likely tokens at its position."""

    token: str
    token_bytes: bytes
    logprob: float | None
    top_logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it


@dataclass(frozen=True)
class GenerationChunk:
    """New text since the previous chunk of the same choice; the last carries the finish reason."""

    text: str
    finish_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    index: int = 0  # which of the n choices
    logprobs: tuple[TokenLogprob, ...] = ()  # the tokens sampled since the previous chunk
    tool_calls: tuple[ToolCall, ...] = ()
    # with its choice's first chunk, when SamplingParams.prompt_logprobs asked for them
    prompt_logprobs: tuple[PromptTokenLogprob, ...] | None = None
    cached_tokens: int = 0  # of prompt_tokens, those the prefix cache held (not prefilled)


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    index: int = 0
    logprobs: tuple[TokenLogprob, ...] | None = None  # None unless asked for
    tool_calls: tuple[ToolCall, ...] = ()
    prompt_logprobs: tuple[PromptTokenLogprob, ...] | None = None  # None unless asked for
    cached_tokens: int = 0  # of prompt_tokens, those the prefix cache held (not prefilled)


def merge_chunks(chunks: Sequence[GenerationChunk]) -> GenerationChunk:
    """Consecutive chunks of one choice as one: the text, tokens and tool calls of all, the
    counts and finish reason of the last, the prompt logprobs of the first."""
    if len(chunks) == 1:
        return chunks[0]
    return dataclasses.replace(
        chunks[-1],
        text="".join(chunk.text for chunk in chunks),
        logprobs=tuple(lp for chunk in chunks for lp in chunk.logprobs),
        tool_calls=tuple(call for chunk in chunks for call in chunk.tool_calls),
        prompt_logprobs=chunks[0].prompt_logprobs,
    )
