"""The long prompt's chunk sizes (`PrefillPacer`): `largest` when nobody else decodes or there is
no budget; else what fits in a share of the others' decode step, settling where a chunk costs
the budget on a chunk cost of a fixed part plus a part per token, in steps of at most 2x."""

from __future__ import annotations

from deployments.replica.engine.prefill_pacing import FIRST_PACED_CHUNK, PrefillPacer

FIXED_S, PER_TOKEN_S = 0.030, 0.0035  # the at-size GLM's chunk cost, roughly
DECODE_S = 0.058


def chunk_cost(tokens: int) -> float:
    return FIXED_S + PER_TOKEN_S * tokens


def test_largest_when_nobody_else_decodes_or_without_a_budget():
    pacer = PrefillPacer(256, 1.0)
    pacer.decoded(DECODE_S)
    assert pacer.next_chunk(others_decoding=False) == 256
    unpaced = PrefillPacer(256, None)
    unpaced.decoded(DECODE_S)
    assert unpaced.next_chunk(others_decoding=True) == 256
    assert PrefillPacer(256, 1.0).next_chunk(others_decoding=True) == 256  # no step seen yet


def test_chunks_settle_where_one_costs_the_share_of_a_decode_step():
    pacer = PrefillPacer(256, 1.0)
    pacer.decoded(DECODE_S)
    sizes = []
    for _ in range(12):
        size = pacer.next_chunk(others_decoding=True)
        sizes.append(size)
        pacer.chunked(size, chunk_cost(size))
        pacer.decoded(DECODE_S)
    assert sizes[0] == FIRST_PACED_CHUNK
    budget_tokens = (DECODE_S - FIXED_S) / PER_TOKEN_S  # 8: a chunk of 8 costs one step
    assert abs(sizes[-1] - budget_tokens) <= 1
    assert all(chunk_cost(s) <= 1.1 * DECODE_S for s in sizes[3:])


def test_a_half_share_halves_the_chunks_time_and_a_small_start_grows_at_most_twofold():
    pacer = PrefillPacer(256, 0.5)
    pacer.decoded(1.0)
    pacer.chunked(1, 0.001)  # a token costs 1 ms: half a 1 s step holds 500
    first = pacer.next_chunk(others_decoding=True)
    assert first == 256  # never past largest
    pacer = PrefillPacer(256, 0.5)
    pacer.decoded(1.0)
    pacer.chunked(4, 0.4)
    assert pacer.next_chunk(others_decoding=True) == 5  # 0.5 s at 0.1 s a token
    pacer.chunked(5, 0.05)  # cheaper than thought: 10 ms a token
    assert pacer.next_chunk(others_decoding=True) == 10  # 50 would fit; 2x the last at most


def test_a_shrinking_step_shrinks_the_chunk_and_one_token_is_the_least():
    pacer = PrefillPacer(256, 1.0)
    pacer.decoded(0.1)
    pacer.chunked(16, 0.16)
    assert pacer.next_chunk(others_decoding=True) == 10
    pacer.decoded(0.001)  # the others' step became tiny (one stream left, say)
    assert pacer.next_chunk(others_decoding=True) == 1


def test_chunks_counts_a_long_prompt_at_the_last_paced_size():
    pacer = PrefillPacer(256, 1.0)
    assert pacer.chunks(256) == 1  # not long: one piece
    assert pacer.chunks(600) == 3  # before any pacing: chunks of largest
    pacer.decoded(0.1)
    pacer.chunked(16, 0.16)
    assert pacer.next_chunk(others_decoding=True) == 10
    assert pacer.chunks(600) == 60
    assert PrefillPacer(256, None).chunks(600) == 3
