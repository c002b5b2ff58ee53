"""The moderation gate of chat models: the input is classified before generation, the output in
fixed windows, each window checked before any of it is released, so text a client has seen is
never taken back."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from deployments.errors import ContentPolicyViolationError
from deployments.runtime.llm import GenerationChunk
from deployments.security.config import ModerationGateConfig

# One verdict per text, in order: True when the moderation model flags it.
Classify = Callable[[list[str]], Awaitable[list[bool]]]

CONTENT_FILTER = "content_filter"


def split_windows(text: str, window_chars: int) -> list[str]:
    """`text` cut every `window_chars` characters; the last window may be shorter."""
    return [text[start : start + window_chars] for start in range(0, len(text), window_chars)]


def with_context(context: str, window: str, overlap_chars: int) -> tuple[str, str]:
    """(what to classify for `window`, the context for the next window). The tail of what came
    before is classified with each window, so a word cut at a boundary is still seen whole."""
    if overlap_chars == 0:
        return window, ""
    seen = context + window
    return seen, seen[-overlap_chars:]


def _filtered(last: GenerationChunk) -> GenerationChunk:
    # GenerationChunk's FinishReason names only the runtime's reasons; the gate adds its own.
    reason: Any = CONTENT_FILTER
    return GenerationChunk("", reason, last.prompt_tokens, last.completion_tokens, index=last.index)


class ModerationGate:
    """Checks the chat models named in the config with `classify` (the router passes a call of
    the moderation deployment). A moderation failure propagates: the gate fails closed."""

    def __init__(self, config: ModerationGateConfig, classify: Classify):
        self.config = config
        self._classify = classify
        self._models = frozenset(config.models)

    def applies_to(self, model: str) -> bool:
        return model in self._models

    async def _flags(self, texts: list[str]) -> list[bool]:
        flags = await self._classify(texts)
        if len(flags) != len(texts):
            raise ValueError(f"moderation returned {len(flags)} verdicts for {len(texts)} texts")
        return [bool(flag) for flag in flags]

    def _classified_windows(self, text: str) -> list[str]:
        texts, context = [], ""
        for window in split_windows(text, self.config.window_chars):
            classified, context = with_context(context, window, self.config.overlap_chars)
            texts.append(classified)
        return texts

    async def check_input(self, messages: Sequence[Mapping[str, Any]]) -> None:
        """ContentPolicyViolationError (400) if any message's content is flagged. Every role is
        checked: a client can write the assistant's turns too."""
        if not self.config.check_input:
            return
        indexed = [
            (index, str(message.get("content") or "")) for index, message in enumerate(messages)
        ]
        indexed = [(index, text) for index, text in indexed if text]
        if not indexed:
            return
        flags = await self._flags([text for _, text in indexed])
        flagged = [index for (index, _), flag in zip(indexed, flags, strict=True) if flag]
        if flagged:
            raise ContentPolicyViolationError(
                f"messages {flagged} were flagged by the content policy",
                param=f"messages.{flagged[0]}.content",
            )

    async def filter_output(self, text: str, finish_reason: str) -> tuple[str, str]:
        """A whole answer, checked in the same windows a stream of it would be: the refusal text
        and "content_filter" if any window is flagged, else the answer unchanged."""
        if not self.config.check_output or not text:
            return text, finish_reason
        if any(await self._flags(self._classified_windows(text))):
            return self.config.refusal_text, CONTENT_FILTER
        return text, finish_reason

    async def guard_stream(
        self, chunks: AsyncIterator[GenerationChunk], choices: int = 1
    ) -> AsyncIterator[GenerationChunk]:
        """Re-chunk a generation into checked windows, each choice (`index`) on its own. Up to
        one window per choice is held back; a flagged window is never released and that choice
        ends with finish_reason "content_filter"; once every choice ended, the generation
        upstream is closed (freeing the model's slot). Logprobs and tool calls ride along with
        the window that releases their text."""
        if not self.config.check_output:
            async for chunk in chunks:
                yield chunk
            return
        size, overlap = self.config.window_chars, self.config.overlap_chars
        pending: dict[int, str] = {}
        context: dict[int, str] = {}
        held_logprobs: dict[int, tuple[Any, ...]] = {}
        ended: set[int] = set()
        try:
            async for chunk in chunks:
                index = chunk.index
                if index in ended:
                    continue
                text = pending.get(index, "") + chunk.text
                held_logprobs[index] = held_logprobs.get(index, ()) + chunk.logprobs
                flagged = False
                while len(text) >= size and not flagged:
                    window, text = text[:size], text[size:]
                    classified, context[index] = with_context(
                        context.get(index, ""), window, overlap
                    )
                    if (await self._flags([classified]))[0]:
                        flagged = True
                        break
                    yield dataclasses.replace(
                        chunk,
                        text=window,
                        finish_reason=None,
                        tool_calls=(),
                        logprobs=held_logprobs.pop(index, ()),
                    )
                pending[index] = text
                if not flagged and chunk.finish_reason is not None and text:
                    classified, _ = with_context(context.get(index, ""), text, overlap)
                    flagged = (await self._flags([classified]))[0]
                if flagged:
                    ended.add(index)
                    yield _filtered(chunk)
                elif chunk.finish_reason is not None:
                    ended.add(index)
                    yield dataclasses.replace(
                        chunk, text=text, logprobs=held_logprobs.pop(index, ())
                    )
                if len(ended) == choices:
                    return
        finally:
            close = getattr(chunks, "aclose", None)
            if close is not None:
                await close()
