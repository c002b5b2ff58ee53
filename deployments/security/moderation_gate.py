"""The moderation gate of chat models: the input is classified before generation, the output in
fixed windows, each window checked before any of it is released, so text a client has seen is
never taken back."""

from __future__ import annotations

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
    return GenerationChunk("", reason, last.prompt_tokens, last.completion_tokens)


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
        self, chunks: AsyncIterator[GenerationChunk]
    ) -> AsyncIterator[GenerationChunk]:
        """Re-chunk a generation into checked windows. Up to one window is held back; a flagged
        window is never released, the stream ends with finish_reason "content_filter", and the
        generation upstream is closed (freeing the model's slot)."""
        if not self.config.check_output:
            async for chunk in chunks:
                yield chunk
            return
        size, overlap = self.config.window_chars, self.config.overlap_chars
        pending, context = "", ""
        last: GenerationChunk | None = None
        try:
            async for chunk in chunks:
                last = chunk
                pending += chunk.text
                while len(pending) >= size:
                    window, pending = pending[:size], pending[size:]
                    classified, next_context = with_context(context, window, overlap)
                    if (await self._flags([classified]))[0]:
                        yield _filtered(chunk)
                        return
                    context = next_context
                    yield GenerationChunk(
                        window, None, chunk.prompt_tokens, chunk.completion_tokens
                    )
                if chunk.finish_reason is not None:
                    break
            if last is None:
                return
            if pending:
                classified, _ = with_context(context, pending, overlap)
                if (await self._flags([classified]))[0]:
                    yield _filtered(last)
                    return
            yield GenerationChunk(
                pending, last.finish_reason, last.prompt_tokens, last.completion_tokens
            )
        finally:
            close = getattr(chunks, "aclose", None)
            if close is not None:
                await close()
