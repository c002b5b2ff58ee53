"""SlotDecoder on a tiny fused graph: a ragged batch decodes as each sequence alone, a released
slot takes the last sequence in, the buffers grow mid-run and their capacity is cut back once a
long sequence left, and misuse is refused."""

from __future__ import annotations

import numpy as np
import pytest
from fused_glm_fixtures import export_fused, tiny_glm_checkpoint

from deployments.export.fused_parity import open_session
from deployments.replica.engine.slot_decoder import NoFreeSlot, SlotDecoder

PROMPTS = ([5, 17, 301, 42, 9, 1000, 77], [8, 9], [400, 3, 3, 12, 19, 25, 31, 44, 50, 61, 70])
CONTINUATION = [11, 12, 13, 14, 15, 16, 17, 18]
ATOL = 1e-4


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    _, checkpoint = tiny_glm_checkpoint(tmp_path_factory.mktemp("tiny-glm"))
    out = tmp_path_factory.mktemp("fused") / "glm"
    manifest = export_fused(checkpoint, out)
    return open_session(out, manifest), manifest


def _decoder(graph, slots=3, grow_by=8) -> SlotDecoder:
    session, manifest = graph
    return SlotDecoder(session, manifest.llm.kv_cache, manifest.vocab_size, slots, 64, grow_by)


def _alone(graph, prompt) -> np.ndarray:
    decoder = _decoder(graph, slots=1, grow_by=64)  # never grows
    rows = [decoder.prefill(prompt)[1].copy()]
    rows += [decoder.step([t])[0].copy() for t in CONTINUATION]
    return np.stack(rows)


def test_ragged_batch_with_release_and_growth_matches_each_sequence_alone(graph):
    expected = [_alone(graph, p) for p in PROMPTS]
    decoder = _decoder(graph)
    got: list[list[np.ndarray]] = [[] for _ in PROMPTS]
    for i, prompt in enumerate(PROMPTS):
        slot, logits = decoder.prefill(prompt)
        assert slot == i
        got[i].append(logits.copy())
    assert decoder.capacity == 16  # the longest prompt (11) rounded up to grow_by
    owners = [0, 1, 2]  # owners[slot] = sequence
    for step, token in enumerate(CONTINUATION):
        if step == 3:  # sequence 0 leaves: the last slot's sequence moves into slot 0
            assert decoder.release(0) == 2
            owners = [2, 1]
            assert decoder.lengths[0] == len(PROMPTS[2]) + 3
        logits = decoder.step([token] * decoder.active)
        for slot, seq in enumerate(owners):
            got[seq].append(logits[slot].copy())
    assert decoder.capacity == 24  # grew mid-run: 11 + 8 positions
    for seq, rows in enumerate(got):
        np.testing.assert_allclose(np.stack(rows), expected[seq][: len(rows)], atol=ATOL)


def test_extend_continues_a_prefix_like_one_prefill(graph):
    prompt = PROMPTS[2]
    whole = _decoder(graph).prefill(prompt)[1].copy()
    chunked = _decoder(graph)
    slot, _ = chunked.prefill(prompt[:4])
    np.testing.assert_allclose(chunked.extend(slot, prompt[4:]), whole, atol=ATOL)
    assert chunked.lengths[slot] == len(prompt)


def test_full_slots_and_wrong_calls_are_refused(graph):
    decoder = _decoder(graph, slots=1)
    decoder.prefill([1, 2])
    with pytest.raises(NoFreeSlot):
        decoder.prefill([3])
    with pytest.raises(ValueError, match="2 tokens for 1"):
        decoder.step([1, 2])
    with pytest.raises(IndexError):
        decoder.release(1)
    with pytest.raises(ValueError, match="max_len"):
        decoder.extend(0, list(range(70)))
    assert decoder.release(0) is None and decoder.active == 0


def test_swap_more_slots_and_a_partial_step_keep_each_sequence_its_own(graph):
    expected = [_alone(graph, p) for p in PROMPTS]
    decoder = _decoder(graph, slots=1)
    decoder.prefill(PROMPTS[0])
    decoder.ensure_slots(3)  # grown with a sequence in it: slot 0 keeps its positions
    assert decoder.slots == 3
    decoder.prefill(PROMPTS[1])
    decoder.swap(0, 1)  # now PROMPTS[1] in slot 0, PROMPTS[0] in slot 1
    decoder.prefill(PROMPTS[2][:5])  # being prefilled in chunks: sits out the next step
    logits = decoder.step(CONTINUATION[:1] * 2)
    assert logits.shape[0] == 2 and decoder.lengths[2] == 5
    np.testing.assert_allclose(logits[0], expected[1][1], atol=ATOL)
    np.testing.assert_allclose(logits[1], expected[0][1], atol=ATOL)
    np.testing.assert_allclose(decoder.extend(2, PROMPTS[2][5:]), expected[2][0], atol=ATOL)


def test_a_failed_prefill_leaves_no_slot_taken(graph):
    decoder = _decoder(graph, slots=2)
    with pytest.raises(ValueError, match="max_len"):
        decoder.prefill(list(range(70)))
    assert decoder.active == 0


def test_fit_capacity_cuts_back_once_a_long_sequence_left_and_the_rest_decode_on(graph):
    expected = _alone(graph, PROMPTS[1])
    decoder = _decoder(graph)
    short, first = decoder.prefill(PROMPTS[1])
    long, _ = decoder.prefill(list(range(3, 40)))  # 37 positions: capacity 40
    assert decoder.capacity == 40
    decoder.fit_capacity()
    assert decoder.capacity == 40  # still needed
    assert decoder.release(long) is None
    decoder.fit_capacity()
    assert decoder.capacity == 8 and decoder.slots == 3  # the short one's 2 (+1) in one grow_by
    got = [first]
    got += [decoder.step([t])[0].copy() for t in CONTINUATION]  # grows again past 8
    np.testing.assert_allclose(np.stack(got), expected, atol=ATOL)
    assert decoder.lengths[short] == len(PROMPTS[1]) + len(CONTINUATION)
    decoder.fit_capacity()
    assert decoder.capacity == 16  # 10 positions (+1): within a grow_by of it, kept
