"""Choosing the next token for a whole batch in one numpy pass, and where generated text must stop.

Per row, in this order (vLLM's): logit_bias, repetition penalty (prompt and output tokens), then
frequency and presence penalties (output tokens), the grammar's token mask, temperature, top_k,
top_p, one draw from the row's own seeded generator. Log-probabilities are those of the model's
own distribution (log_softmax of the raw logits), as OpenAI reports them. What a row asks
(`SamplingParams`) is plain data in `sampling_params`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

# numpy imports its random module on first use (np.random): 24 ms of a new replica's first
# request, paid here instead, where the warm pool imports this module ahead of any replica.
import numpy.random  # noqa: F401

from deployments.contracts.sampling_params import SamplingParams


@dataclass
class SamplingState:
    """One sequence's sampling memory: its generator and, when a penalty needs them, how often
    each token was generated and which tokens the prompt holds."""

    params: SamplingParams
    vocab_size: int
    prompt: Sequence[int] = ()
    seed_offset: int = 0  # choice index for n > 1: each choice draws its own stream
    rng: np.random.Generator = field(init=False)
    output_counts: np.ndarray | None = field(init=False, default=None)
    prompt_seen: np.ndarray | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        seed = self.params.seed
        if seed is not None and self.seed_offset:
            self.rng = np.random.default_rng([seed % 2**64, self.seed_offset])
        else:
            self.rng = np.random.default_rng(None if seed is None else seed % 2**64)
        if self.params.counts_tokens:
            self.output_counts = np.zeros(self.vocab_size, np.int32)
            self.prompt_seen = np.zeros(self.vocab_size, bool)
            ids = np.asarray(self.prompt, dtype=np.int64)
            self.prompt_seen[ids[(ids >= 0) & (ids < self.vocab_size)]] = True

    def record(self, token: int) -> None:
        if self.output_counts is not None and 0 <= token < self.vocab_size:
            self.output_counts[token] += 1


class SampledToken(NamedTuple):  # a tuple: one is built per row and step
    token: int
    logprob: float | None = None  # of the model's distribution; None unless asked
    top_logprobs: tuple[tuple[int, float], ...] = ()  # most likely first


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    peak = x.max(axis=-1, keepdims=True)
    return x - peak - np.log(np.exp(x - peak).sum(axis=-1, keepdims=True))


def sample_batch(
    logits: np.ndarray,
    states: Sequence[SamplingState],
    allowed: np.ndarray | None = None,
) -> list[SampledToken]:
    """The next token of every row of `logits` [batch, vocab]. `allowed` [batch, vocab] (bool) is
    the grammar's mask: a False token cannot be drawn. Rows without a grammar are all True.

    In float32, the model's own precision: a draw needs no more (rounding moves a token's
    probability by parts in 10^7, far below what a test of the distribution can see), and each
    pass over a batch's rows costs about half as much as in float64. Log-probabilities are
    float64."""
    batch, vocab = logits.shape
    params = [s.params for s in states]
    # No copy where it is float32 already: every change below makes a new array, except the
    # bias, which copies first; the caller's logits stay the model's.
    x = logits.astype(np.float32, copy=False)

    biased = [(row, p.logit_bias) for row, p in enumerate(params) if p.logit_bias]
    if biased:
        x = x.copy()
        for row, pairs in biased:
            ids = np.fromiter((t for t, _ in pairs), np.int64)
            ok = (ids >= 0) & (ids < vocab)
            x[row, ids[ok]] += np.fromiter((b for _, b in pairs), np.float32)[ok]

    if any(s.output_counts is not None for s in states):  # a penalty is on
        counts = np.zeros((batch, vocab), np.float32)
        seen = np.zeros((batch, vocab), bool)
        for row, s in enumerate(states):
            if s.output_counts is not None and s.prompt_seen is not None:
                width = min(vocab, len(s.output_counts))
                counts[row, :width] = s.output_counts[:width]
                seen[row, :width] = s.prompt_seen[:width]
        seen |= counts > 0
        rep = np.array([p.repetition_penalty for p in params], np.float32)[:, None]
        # CTRL's rule: shrink a seen token's positive logit, grow its negative one.
        x = np.where(seen, np.where(x > 0, x / rep, x * rep), x)
        freq = np.array([p.frequency_penalty for p in params], np.float32)[:, None]
        presence = np.array([p.presence_penalty for p in params], np.float32)[:, None]
        x -= counts * freq + (counts > 0) * presence

    if allowed is not None:
        x = np.where(allowed[:, :vocab], x, -np.inf)
        if not np.isfinite(x.max(axis=1)).all():
            raise ValueError("the token mask allows no token in some row")

    drawn = [row for row, p in enumerate(params) if not p.greedy]
    if len(drawn) == batch:  # the usual batch: no copy of the rows
        tokens = _draw(x, params, states)
    else:
        tokens = np.argmax(x, axis=1)  # greedy rows keep this
        if drawn:
            tokens[drawn] = _draw(x[drawn], [params[r] for r in drawn], [states[r] for r in drawn])

    wants = [row for row, p in enumerate(params) if p.logprobs]
    logprobs = log_softmax(logits[wants]) if wants else None
    out: list[SampledToken] = []
    for row, token in enumerate(tokens.tolist()):
        state = states[row]
        if state.output_counts is not None:
            state.record(token)
        p = params[row]
        if not p.logprobs or logprobs is None:
            out.append(SampledToken(token))
            continue
        lp = logprobs[wants.index(row)]
        top: tuple[tuple[int, float], ...] = ()
        if p.top_logprobs:
            best = np.argpartition(-lp, p.top_logprobs - 1)[: p.top_logprobs]
            best = best[np.argsort(-lp[best], kind="stable")]
            top = tuple((int(t), float(lp[t])) for t in best)
        out.append(SampledToken(token, float(lp[token]), top))
    return out


def _draw(
    x: np.ndarray, params: Sequence[SamplingParams], states: Sequence[SamplingState]
) -> np.ndarray:
    """One draw per row from softmax(x / temperature), truncated by top_k and top_p."""
    rows, vocab = x.shape
    inverse_temperature = 1.0 / np.array([p.temperature for p in params], np.float32)[:, None]
    # In place, one temporary: a batch's rows are large enough that each allocation counts.
    # Unnormalised: the inverse CDF scales its target by each row's total instead.
    probs = x - x.max(axis=1, keepdims=True)
    probs *= inverse_temperature
    np.exp(probs, out=probs)
    uniform = np.array([s.rng.random() for s in states])
    if not any(0 < p.top_k < vocab or p.top_p < 1.0 for p in params):
        return _inverse_cdf(probs, uniform)
    top_k = np.array([p.top_k if 0 < p.top_k < vocab else vocab for p in params])
    top_p = np.array([p.top_p for p in params], np.float32)
    order = np.argsort(-probs, axis=1, kind="stable")
    ranked = np.take_along_axis(probs, order, axis=1)
    mass_before = np.cumsum(ranked, axis=1) - ranked
    total = mass_before[:, -1] + ranked[:, -1]
    # Keep the smallest prefix whose mass reaches top_p, and at most top_k (always one).
    keep = (np.arange(vocab)[None, :] < top_k[:, None]) & (mass_before < (top_p * total)[:, None])
    keep[:, 0] = True
    picked = _inverse_cdf(np.where(keep, ranked, 0.0), uniform)
    return order[np.arange(rows), picked]


CDF_BLOCK = 64
_BLOCK_ONES = np.ones(CDF_BLOCK, np.float32)


def _inverse_cdf(weights: np.ndarray, uniform: np.ndarray) -> np.ndarray:
    """Per row, the token whose cumulative weight first passes `uniform` x the row's total.
    Zero-weight tokens are never picked. In two levels, block sums then one block's running sum,
    because a running sum over the whole vocabulary is sequential and was most of a step. The
    block sums are a matrix-vector product: numpy's sum along 64-wide rows took 5x as long."""
    rows, vocab = weights.shape
    blocks = -(-vocab // CDF_BLOCK)
    if blocks * CDF_BLOCK != vocab:
        weights = np.pad(weights, ((0, 0), (0, blocks * CDF_BLOCK - vocab)))
    blocked = weights.reshape(rows, blocks, CDF_BLOCK)
    block_cdf = np.cumsum(blocked @ _BLOCK_ONES, axis=1)
    # Strictly below the total, so the block found (and the token in it) has positive weight.
    target = np.minimum(uniform * block_cdf[:, -1], np.nextafter(block_cdf[:, -1], 0))
    block = np.minimum((block_cdf <= target[:, None]).sum(axis=1), blocks - 1)
    row = np.arange(rows)
    inner = np.cumsum(blocked[row, block], axis=1)
    before = np.where(block > 0, block_cdf[row, np.maximum(block - 1, 0)], 0.0)
    # Block sums and running sums round differently: keep the target inside the chosen block.
    local = np.clip(target - before, 0.0, np.nextafter(inner[:, -1], 0))
    within = np.minimum((inner <= local[:, None]).sum(axis=1), CDF_BLOCK - 1)
    return block * CDF_BLOCK + within


def sample_token(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """One row, no penalties or mask: kept for callers that sample outside a batch."""
    state = SamplingState(params, logits.shape[-1])
    state.rng = rng
    return sample_batch(logits[None, :], [state])[0].token


class StopStringMatcher:
    """Finds the first stop string in growing text and says how much text is safe to emit:
    a tail that could still become a stop string is held back until it can't."""

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(stops)
        self._longest = max((len(s) for s in self.stops), default=0)

    def find(self, text: str, start: int = 0) -> int | None:
        """Index of the earliest stop string at or after `start` (minus overlap), else None."""
        from_ = max(0, start - self._longest + 1)
        hits = [i for i in (text.find(s, from_) for s in self.stops) if i >= 0]
        return min(hits) if hits else None

    def safe_length(self, text: str) -> int:
        for keep in range(min(self._longest - 1, len(text)), 0, -1):
            tail = text[-keep:]
            if any(s.startswith(tail) for s in self.stops):
                return len(text) - keep
        return len(text)
