"""How many tokens the next chunk of a long prompt takes.

A long prompt (longer than `largest`) goes into the graph in chunks, the sequences already
decoding taking one decode step between two. A running stream then waits a decode step plus a
chunk between two tokens, so a chunk of `largest` tokens at size stalls it many times over (a
chunk of 256 costs about 1 s where a decode step costs 50-100 ms). Given a `step_share`, while
others decode the pacer sizes each chunk to what fits in that share of their decode step's time,
from what the last chunk cost per token: a chunk's cost is a fixed part (the weights read once)
plus a part per token, so a small chunk's cost per token overstates a larger one's, and the sizes
settle where a chunk takes the budget, approached in steps of at most 2x. That fixed part is also
what pacing costs the long prompt: its small chunks each pay it (the user_config's description).
With nobody decoding the prompt goes in chunks of `largest`: then nothing waits on it but its own
first token.
"""

from __future__ import annotations

# The first chunk taken while others decode, before any chunk's cost was seen.
FIRST_PACED_CHUNK = 16
GROWTH = 2  # a paced chunk is at most this many times the last paced one


class PrefillPacer:
    def __init__(self, largest: int, step_share: float | None):
        self.largest = largest  # prefill_chunk_tokens
        self.step_share = step_share  # None: chunks of `largest` always
        self._decode_s: float | None = None  # the last decode step
        self._token_s: float | None = None  # seconds per token of the last chunk
        self._last_paced: int | None = None

    def decoded(self, seconds: float) -> None:
        self._decode_s = seconds

    def chunked(self, tokens: int, seconds: float) -> None:
        if tokens > 0:
            self._token_s = seconds / tokens

    def next_chunk(self, *, others_decoding: bool) -> int:
        """Tokens for the next chunk: `largest` unless others decode and there is a budget."""
        if not others_decoding or self.step_share is None or self._decode_s is None:
            return self.largest
        if self._token_s is None or self._token_s <= 0:
            size = FIRST_PACED_CHUNK
        else:
            size = round(self.step_share * self._decode_s / self._token_s)
        if self._last_paced is not None:
            size = min(size, GROWTH * self._last_paced)
        size = max(1, min(self.largest, size))
        self._last_paced = size
        return size

    def chunks(self, tokens: int) -> int:
        """How many chunks a prompt of `tokens` is expected to take (a KV estimate counts the
        others' decode steps between them): one if it is not long; else at the last paced size
        (smaller chunks, more steps between them), or `largest` before any was paced."""
        if tokens <= self.largest:
            return 1
        paced = self._last_paced if self.step_share is not None else None
        chunk = self.largest if paced is None else min(self.largest, paced)
        return -(-tokens // chunk)
