"""The moderation gate of chat models: the input is classified (while the generation starts; nothing
is released before its verdict), a whole answer in fixed windows, and a stream piece by piece: up
to its last word boundary, each piece classified with the tail before it and released only once
checked, so text a client has seen is never taken back and a word cut between chunks is classified
whole. Chinese and Japanese, written without spaces, flow a character behind the model instead of
a sentence. When the classifier fails, `gate_failures.py` decides per direction: refuse (503) or
let the text through unchecked, marked."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

from deployments.config.security import ModerationGateConfig
from deployments.contracts.outputs import FinishReason, GenerationChunk
from deployments.errors import ContentPolicyViolationError
from deployments.ingress.security.gate_failures import Direction, GateFailures, OnFailure, OnSkip

# One verdict per text, in order: True when the moderation model flags it.
Classify = Callable[[list[str]], Awaitable[list[bool]]]

CONTENT_FILTER: Final = "content_filter"


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


# Scripts written without spaces between words: Han ideographs and Japanese kana. Each of their
# characters ends a word (a Latin run stops at one too), so Chinese or Japanese text is not held
# whole until punctuation. Hangul is written with spaces; Thai and its neighbours, whose words
# span several characters with no mark between them, are held like Latin.
UNSPACED_RANGES: Final = (
    (0x3040, 0x30FF),  # hiragana, katakana
    (0x31F0, 0x31FF),  # katakana phonetic extensions
    (0x3400, 0x4DBF),  # CJK extension A
    (0x4E00, 0x9FFF),  # CJK unified ideographs
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0xFF66, 0xFF9F),  # halfwidth katakana
    (0x20000, 0x3FFFF),  # CJK extensions B and later
)


def is_unspaced(char: str) -> bool:
    point = ord(char)
    return any(low <= point <= high for low, high in UNSPACED_RANGES)


def held_unspaced(pending: str) -> str:
    """The unspaced character `releasable_length` held back, or "": it is classified with the
    piece released before it (which it may form a word with), and released with the next one."""
    return pending if len(pending) == 1 and is_unspaced(pending) else ""


def _continues_word(char: str) -> bool:
    return (char.isalnum() or char == "_") and not is_unspaced(char)


def releasable_length(text: str, window_chars: int) -> int:
    """How much of a stream's unreleased `text` may be checked and released now: up to the end of
    its last whole word. The trailing run of word characters may go on in the next chunk, so it
    is held, unless it has reached `window_chars` (a long run with no boundary still flows). In
    unspaced scripts every character ends a word, but the last one is held for the next chunk
    and classified with the piece before it (`held_unspaced`): a two-character word (most
    Chinese words are one or two characters) is judged whole before any of it is released."""
    end = len(text)
    while end and _continues_word(text[end - 1]):
        end -= 1
    if end == len(text) and end and is_unspaced(text[end - 1]):
        end -= 1
    return len(text) if len(text) - end >= window_chars else end


def _filtered(last: GenerationChunk) -> GenerationChunk:
    # GenerationChunk's FinishReason names only the runtime's reasons; the gate adds its own.
    reason: Any = CONTENT_FILTER
    return GenerationChunk(
        "",
        reason,
        last.prompt_tokens,
        last.completion_tokens,
        index=last.index,
        cached_tokens=last.cached_tokens,
    )


class ModerationGate:
    """Checks the chat models named in the config with `classify` (the router passes its own
    copy of an embedded classifier, or a call of the moderation deployment). A failure of
    `classify` goes to the config's `on_classifier_failure` (`on_failure` counts it); each
    check's `on_skip` hears of a direction that went unchecked."""

    def __init__(
        self,
        config: ModerationGateConfig,
        classify: Classify,
        on_failure: OnFailure | None = None,
    ):
        self.config = config
        self._classify = classify
        self._models = frozenset(config.models)
        self._failures = GateFailures(config.on_classifier_failure, on_failure)

    def applies_to(self, model: str) -> bool:
        return model in self._models

    async def _flags(self, texts: list[str]) -> list[bool]:
        flags = await self._classify(texts)
        if len(flags) != len(texts):
            raise ValueError(f"moderation returned {len(flags)} verdicts for {len(texts)} texts")
        return [bool(flag) for flag in flags]

    async def _checked_flags(
        self, direction: Direction, texts: list[str], on_skip: OnSkip | None
    ) -> list[bool] | None:
        """The verdicts, or None when the classifier failed and `direction` fails open."""
        try:
            return await self._flags(texts)
        except Exception as error:  # noqa: BLE001 - whatever broke it, the config decides; logged
            self._failures.handle(direction, error, on_skip)
            return None

    def _classified_windows(self, text: str) -> list[str]:
        texts, context = [], ""
        for window in split_windows(text, self.config.window_chars):
            classified, context = with_context(context, window, self.config.overlap_chars)
            texts.append(classified)
        return texts

    async def check_input(
        self, messages: Sequence[Mapping[str, Any]], on_skip: OnSkip | None = None
    ) -> None:
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
        flags = await self._checked_flags("input", [text for _, text in indexed], on_skip)
        if flags is None:
            return
        flagged = [index for (index, _), flag in zip(indexed, flags, strict=True) if flag]
        if flagged:
            raise ContentPolicyViolationError(
                f"messages {flagged} were flagged by the content policy",
                param=f"messages.{flagged[0]}.content",
            )

    async def filter_output(
        self, text: str, finish_reason: FinishReason, on_skip: OnSkip | None = None
    ) -> tuple[str, FinishReason]:
        """A whole answer, checked in windows of `window_chars`, each with the tail before it
        (nobody waits for a piece of it): the refusal text and "content_filter" if any window
        is flagged, else the answer unchanged."""
        if not self.config.check_output or not text:
            return text, finish_reason
        flags = await self._checked_flags("output", self._classified_windows(text), on_skip)
        if flags is not None and any(flags):
            return self.config.refusal_text, CONTENT_FILTER
        return text, finish_reason

    async def guard_stream(
        self,
        chunks: AsyncIterator[GenerationChunk],
        choices: int = 1,
        on_skip: OnSkip | None = None,
    ) -> AsyncIterator[GenerationChunk]:
        """Re-chunk a generation into checked pieces, each choice (`index`) on its own: each
        chunk's text up to its last word boundary (`releasable_length`) is classified with the
        tail released before it and then released; the rest is held. A flagged piece is never
        released and that choice ends with finish_reason "content_filter"; once every choice
        ended, the generation upstream is closed (freeing the model's slot). Logprobs and tool
        calls ride along with the piece that releases their text. Once the classifier failed
        and the output fails open, the rest of the stream flows unchecked (one failure, not a
        stalled call per piece while it is down)."""
        if not self.config.check_output:
            async for chunk in chunks:
                yield chunk
            return
        size, overlap = self.config.window_chars, self.config.overlap_chars
        pending: dict[int, str] = {}
        context: dict[int, str] = {}
        held_logprobs: dict[int, tuple[Any, ...]] = {}
        held_calls: dict[int, tuple[Any, ...]] = {}
        ended: set[int] = set()
        unchecked = False
        try:
            async for chunk in chunks:
                index = chunk.index
                if index in ended:
                    continue
                text = pending.get(index, "") + chunk.text
                held_logprobs[index] = held_logprobs.get(index, ()) + chunk.logprobs
                held_calls[index] = held_calls.get(index, ()) + chunk.tool_calls
                done = chunk.finish_reason is not None
                cut = len(text) if done or unchecked else releasable_length(text, size)
                piece, pending[index] = text[:cut], text[cut:]
                if piece and not unchecked:
                    classified, context[index] = with_context(
                        context.get(index, ""), piece, overlap
                    )
                    flags = await self._checked_flags(
                        "output", [classified + held_unspaced(pending[index])], on_skip
                    )
                    if flags is None:
                        unchecked = True
                        piece, pending[index] = text, ""
                    elif flags[0]:
                        ended.add(index)
                        yield _filtered(chunk)
                        if len(ended) == choices:
                            return
                        continue
                if piece or done:
                    yield dataclasses.replace(
                        chunk,
                        text=piece,
                        logprobs=held_logprobs.pop(index, ()),
                        tool_calls=held_calls.pop(index, ()),
                    )
                if done:
                    ended.add(index)
                    if len(ended) == choices:
                        return
        finally:
            close = getattr(chunks, "aclose", None)
            if close is not None:
                await close()
