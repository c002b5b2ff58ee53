"""A sequence being generated: one choice of one request, from its prompt to its finish reason.

The engine admits it and feeds it one sampled token per step; the sequence keeps its own
sampling, grammar and detokenizer state and holds back text that may still become a stop string.
Its chunks travel from the engine thread to the request's consumer through `hand_over`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from deployments.contracts.outputs import FinishReason, GenerationChunk, TokenLogprob, merge_chunks
from deployments.contracts.sampling_params import SamplingParams
from deployments.errors import ServingError
from deployments.observability.timings import InferenceTimings
from deployments.replica.engine.decoder import KVCache
from deployments.replica.engine.grammar import GrammarConstraint
from deployments.replica.engine.sampling import (
    SampledToken,
    SamplingState,
    StopStringMatcher,
    sample_batch,
)
from deployments.replica.engine.tokenizer import ChatTokenizer, IncrementalDetokenizer


@dataclass(eq=False)
class SequenceState:
    """One choice of one request while it is generated: its prompt, sampling and grammar state,
    the text decoded so far and what is safe to emit of it, its cache and its consumer's queue."""

    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    eos: frozenset[int]
    tokenizer: ChatTokenizer
    sampling: SamplingState
    queue: asyncio.Queue[GenerationChunk | ServingError] = field(default_factory=asyncio.Queue)
    index: int = 0
    constraint: GrammarConstraint | None = None
    keep_special_tokens: bool = False
    streams: bool = True  # False: the consumer wants only the whole answer
    # Not yet handed to the consumer; touched only by the engine thread.
    held: list[GenerationChunk] = field(default_factory=list)
    matcher: StopStringMatcher = field(init=False)
    detokenizer: IncrementalDetokenizer = field(init=False)
    generated: list[int] = field(default_factory=list)
    text: str = ""  # kept only while stop strings need to see it
    emitted_chars: int = 0
    cache: KVCache | None = None
    cached_tokens: int = 0  # the prompt's first tokens, read from the prefix cache
    timings: InferenceTimings = field(default_factory=InferenceTimings)
    finished: bool = False
    cancelled: bool = False

    def __post_init__(self) -> None:
        self.matcher = StopStringMatcher(self.params.stop)
        self.detokenizer = IncrementalDetokenizer(
            self.tokenizer, skip_special_tokens=not self.keep_special_tokens
        )

    @property
    def positions(self) -> int:
        """Cache positions it needs to take its next token: its prompt and what it generated
        (the last generated token is fed by the next step)."""
        return len(self.prompt) + len(self.generated)

    @property
    def context(self) -> list[int]:
        """What a (re-)prefill feeds: the prompt and, after a preemption, the tokens generated
        before it, so the next token follows the last one streamed."""
        return self.prompt + self.generated if self.generated else self.prompt

    def allowed(self) -> np.ndarray | None:
        """The grammar's mask for the next token, if the request has a grammar."""
        if self.constraint is None:
            return None
        return self.constraint.allowed(self.max_tokens - len(self.generated))

    def accept(self, sampled: SampledToken) -> GenerationChunk:
        """Take the sampled token and turn it into the text that is now safe to emit."""
        token = sampled.token
        finish: FinishReason | None = None
        piece = ""
        if token in self.eos:
            finish = "stop"
        else:
            self.generated.append(token)
            # Holds back an unfinished multi-byte character until its last byte arrives.
            piece = self.detokenizer.push(token)
            if self.constraint is not None:
                self.constraint.accept(token)
                if self.constraint.done:  # the document is complete: nothing may follow
                    finish = "stop"
        if finish is None and len(self.generated) >= self.max_tokens:
            finish = "length"
        if finish is not None:
            piece += self.detokenizer.flush()
        if self.matcher.stops:  # without stop strings every piece is safe to emit at once
            piece, finish = self._until_stop(piece, finish)
        self.finished = finish is not None
        return GenerationChunk(
            piece,
            finish,
            len(self.prompt),
            len(self.generated),
            index=self.index,
            logprobs=() if sampled.logprob is None else self._logprobs(sampled),
            cached_tokens=self.cached_tokens,
        )

    def _until_stop(
        self, piece: str, finish: FinishReason | None
    ) -> tuple[str, FinishReason | None]:
        """The part of the text so far that is safe to emit now, and whether a stop string
        ended it: a tail that could still become a stop string is held back."""
        self.text += piece
        text = self.text
        stop_at = self.matcher.find(text, self.emitted_chars)
        if stop_at is not None:
            end, finish = stop_at, "stop"
        elif finish is not None:
            end = len(text)
        else:
            end = self.matcher.safe_length(text)
        delta = text[self.emitted_chars : max(end, self.emitted_chars)]
        self.emitted_chars += len(delta)
        return delta, finish

    def _logprobs(self, sampled: SampledToken) -> tuple[TokenLogprob, ...]:
        assert sampled.logprob is not None
        top = tuple(self._describe(t, lp) for t, lp in sampled.top_logprobs)
        chosen = self._describe(sampled.token, sampled.logprob)
        return (TokenLogprob(chosen.token, chosen.token_bytes, chosen.logprob, top),)

    def _describe(self, token: int, logprob: float) -> TokenLogprob:
        raw = self.tokenizer.token_bytes(token, skip_special_tokens=False)
        return TokenLogprob(raw.decode("utf-8", errors="replace"), raw, logprob)


def next_tokens(batch: Sequence[SequenceState], logits: np.ndarray) -> list[GenerationChunk]:
    """Each sequence's next token from its row of `logits` [batch, vocab], sampled for the whole
    batch in one pass (grammar masks, sampling, logprobs), then taken by each sequence (stop
    strings, detokenising, finish): what every step runner does with a step's logits."""
    allowed = None
    if any(seq.constraint is not None for seq in batch):
        allowed = np.ones(logits.shape, bool)
        for i, mask in enumerate(seq.allowed() for seq in batch):
            if mask is not None:
                allowed[i, : len(mask)] = mask
                allowed[i, len(mask) :] = False
    sampled = sample_batch(logits, [s.sampling for s in batch], allowed)
    return [seq.accept(token) for seq, token in zip(batch, sampled, strict=True)]


def coalesced(
    items: Sequence[GenerationChunk | ServingError],
) -> Iterator[GenerationChunk]:
    """Queued chunks merged per choice (in the order choices first appear); an error is raised
    after the chunks queued before it."""
    by_choice: dict[int, list[GenerationChunk]] = {}
    for item in items:
        if isinstance(item, ServingError):
            yield from (merge_chunks(chunks) for chunks in by_choice.values())
            raise item
        by_choice.setdefault(item.index, []).append(item)
    yield from (merge_chunks(chunks) for chunks in by_choice.values())


def hand_over(
    loop: asyncio.AbstractEventLoop, batch: list[SequenceState], chunks: list[GenerationChunk]
) -> None:
    """In the engine thread: one step's chunks to the event loop, without waiting for it. A
    whole-answer sequence's chunks are held here until its last one, so a step that only such
    sequences share does not wake the event loop (the wake and the GIL it takes were most of a
    batched step's overhead besides sampling)."""
    ready = []
    for seq, chunk in zip(batch, chunks, strict=True):
        if seq.streams or chunk.finish_reason is not None:
            if seq.held:
                chunk = merge_chunks([*seq.held, chunk])
                seq.held.clear()
            ready.append((seq, chunk))
        else:
            seq.held.append(chunk)
    if ready:
        loop.call_soon_threadsafe(deliver, ready)


def deliver(ready: list[tuple[SequenceState, GenerationChunk]]) -> None:
    """On the event loop: each chunk to its sequence's consumer."""
    for seq, chunk in ready:
        seq.queue.put_nowait(chunk)
