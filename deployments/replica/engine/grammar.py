"""Grammar-constrained decoding with llguidance: a JSON schema or a Lark grammar becomes, at every
step, the set of tokens that keep the text inside the grammar (the sampler masks the rest).

The models may be too weak (or random) to close a document by themselves before `max_tokens`, so
when the budget left is no more than the shortest way to finish, a constraint stops sampling
and completes the document along that path: a constrained answer always parses.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import llguidance
import numpy as np
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

from deployments.contracts.sampling_params import JSON_OPTIONS, GrammarSpec
from deployments.errors import InvalidRequestError

# The order in which the closing path prefers tokens, inside a JSON string and outside one: the
# end of the sequence, then close what is open, then the shortest values. Tokens not listed rank
# by length, longest first (forced text such as a required key goes fastest).
CLOSING_IN_STRING = ('"',)
CLOSING_OUTSIDE_STRING = ("}", "]", ",", '"', "0", "[", "{", ":")
# The closing path starts this many tokens early: one sampled token can lengthen it (half a
# multi-byte character, an opened bracket). Within twice that of the end it is re-measured at
# every step.
CLOSING_MARGIN_TOKENS = 4
MAX_CLOSING_TOKENS = 4096


class GrammarCompiler:
    """One model's vocabulary as llguidance sees it; turns grammars into per-request
    constraints. Built once per model (a few ms), shared by all its requests."""

    def __init__(
        self, tokenizer_json: str | Path, eos_token_ids: Sequence[int], vocab_size: int
    ) -> None:
        text = Path(tokenizer_json).read_text(encoding="utf-8")
        self.tokenizer = llguidance.LLTokenizer(
            text, n_vocab=vocab_size, eos_token=list(eos_token_ids)
        )
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos_token_ids)
        self.token_bytes = [self.tokenizer.decode_bytes([t]) for t in range(vocab_size)]
        self._closing_ranks: dict[tuple[bool, str, str], np.ndarray] = {}

    def closing_rank(
        self, in_string: bool, end_text: str = "", repeat_text: str = ""
    ) -> np.ndarray:
        """Each token's rank on the closing path (lower first). Pieces of `end_text` that are
        not pieces of `repeat_text` come before other unlisted tokens: where a grammar may end
        or repeat (one more tool call), the closing path ends."""
        key = (in_string, end_text, repeat_text)
        if key not in self._closing_ranks:
            preference = CLOSING_IN_STRING if in_string else CLOSING_OUTSIDE_STRING
            preferred = {text.encode(): i + 1 for i, text in enumerate(preference)}
            longest = max(len(b) for b in self.token_bytes)
            ending = (end_text.encode(), repeat_text.encode())
            base = len(preference) + 1

            def rank(piece: bytes) -> int:
                if piece in preferred:
                    return preferred[piece]
                ends = bool(piece) and piece in ending[0] and piece not in ending[1]
                return base + longest - len(piece) + (0 if ends else longest + 1)

            table = np.array([rank(b) for b in self.token_bytes], np.int64)
            table[list(self.eos_token_ids)] = 0
            self._closing_ranks[key] = table
        return self._closing_ranks[key]

    def compile(self, spec: GrammarSpec) -> GrammarConstraint:
        if spec.kind == "lark":
            return self.lark(str(spec.source), spec.param, spec.end_text, spec.repeat_text)
        return self.json_schema(spec.source)

    def json_schema(self, schema: Mapping[str, Any] | None) -> GrammarConstraint:
        """Text that is one JSON value valid against `schema` (None: any JSON object)."""
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(schema if schema is not None else {"type": "object"}),
            overrides=dict(JSON_OPTIONS),  # type: ignore[arg-type]
        )
        return self._constraint(grammar, "response_format")

    def lark(
        self, grammar: str, param: str, end_text: str = "", repeat_text: str = ""
    ) -> GrammarConstraint:
        """Text in a Lark grammar (llguidance's dialect: `%json{...}` embeds a JSON schema).
        `end_text`/`repeat_text`: see `closing_rank`."""
        constraint = self._constraint(llguidance.LLMatcher.grammar_from_lark(grammar), param)
        constraint.ending = (end_text, repeat_text)
        return constraint

    def _constraint(self, grammar: str, param: str) -> GrammarConstraint:
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidRequestError(
                f"cannot constrain output to this schema: {matcher.get_error()}", param=param
            )
        return GrammarConstraint(matcher, self)


class GrammarConstraint:
    """One request's grammar state: the allowed tokens now, and the tokens taken."""

    def __init__(self, matcher: llguidance.LLMatcher, compiler: GrammarCompiler) -> None:
        self._matcher = matcher
        self._compiler = compiler
        self._bitmask = allocate_token_bitmask(1, compiler.vocab_size)
        self._closing_cost: int | None = None
        self._string = _StringState()
        self.closing = False
        self.ending = ("", "")
        self._margin = CLOSING_MARGIN_TOKENS

    @property
    def done(self) -> bool:
        """Nothing can follow: the document is complete."""
        return self._matcher.is_stopped()

    def allowed(self, tokens_left: int) -> np.ndarray:
        """The tokens that may come next ([vocab] bool). With `tokens_left` no more than the
        shortest completion, only that completion's next token."""
        if not self.closing and self._near_budget_end(tokens_left):
            self.closing = True
        mask = self._mask(self._matcher)
        if self.closing:
            only = np.zeros_like(mask)
            only[self._best_closer(mask, self._string)] = True
            return only
        return mask

    def first_mask(self) -> np.ndarray:
        """The allowed tokens now, ignoring the budget."""
        return self._mask(self._matcher)

    def accept(self, token: int) -> None:
        if not self._matcher.consume_token(token):
            raise RuntimeError(f"grammar refused token {token}: {self._matcher.get_error()}")
        self._string.advance(self._compiler.token_bytes[token])

    def closing_cost(self) -> int:
        """Tokens the closing path needs from here to a complete document (its end included)."""
        probe, string = self._matcher.deep_copy(), self._string.copy()
        steps = 0
        while not probe.is_accepting() and steps < MAX_CLOSING_TOKENS:
            token = self._best_closer(self._mask(probe), string)
            if not probe.consume_token(token):
                break
            string.advance(self._compiler.token_bytes[token])
            steps += 1
        return steps if probe.is_stopped() else steps + 1  # + the end-of-sequence token

    def _near_budget_end(self, tokens_left: int) -> bool:
        if self._closing_cost is None:
            self._closing_cost = self.closing_cost()
            if self.ending[1]:
                # One sampled token may start another repetition (a whole tool call): keep room.
                self._margin += self._closing_cost
        elif tokens_left <= self._closing_cost + 2 * self._margin:
            self._closing_cost = self.closing_cost()
        return tokens_left <= self._closing_cost + self._margin

    def _mask(self, matcher: llguidance.LLMatcher) -> np.ndarray:
        fill_next_token_bitmask(matcher, self._bitmask)
        bits = np.unpackbits(self._bitmask.view(np.uint8), bitorder="little")
        return bits[: self._compiler.vocab_size].astype(bool)

    def _best_closer(self, mask: np.ndarray, string: _StringState) -> int:
        rank = self._compiler.closing_rank(string.inside, *self.ending)
        return int(np.argmin(np.where(mask, rank, np.iinfo(np.int64).max)))


class _StringState:
    """Whether the text so far ends inside a JSON string (the closing path's one need to know)."""

    def __init__(self, inside: bool = False, escaped: bool = False) -> None:
        self.inside, self.escaped = inside, escaped

    def copy(self) -> _StringState:
        return _StringState(self.inside, self.escaped)

    def advance(self, text: bytes) -> None:
        for byte in text:
            if self.escaped:
                self.escaped = False
            elif self.inside and byte == 0x5C:  # backslash
                self.escaped = True
            elif byte == 0x22:  # quote
                self.inside = not self.inside
