"""The batched sampler against a plain per-row numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

from deployments.contracts.sampling_params import SamplingParams
from deployments.errors import InvalidRequestError
from deployments.replica.engine.sampling import (
    SamplingState,
    log_softmax,
    sample_batch,
)

VOCAB = 64


def reference_logits(
    logits: np.ndarray, params: SamplingParams, prompt: list[int], generated: list[int]
) -> np.ndarray:
    """What one row's processed logits must be, written the slow obvious way."""
    x = logits.astype(np.float64).copy()
    for token, bias in params.logit_bias:
        x[token] += bias
    for token in set(prompt) | set(generated):
        x[token] = (
            x[token] / params.repetition_penalty
            if x[token] > 0
            else (x[token] * params.repetition_penalty)
        )
    for token in set(generated):
        count = generated.count(token)
        x[token] -= count * params.frequency_penalty + params.presence_penalty
    return x


def reference_distribution(x: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The probabilities one draw samples from, after temperature, top_k and top_p."""
    scaled = x / params.temperature
    p = np.exp(scaled - scaled.max())
    p /= p.sum()
    order = sorted(range(len(p)), key=lambda t: -p[t])
    kept, mass = [], 0.0
    for rank, token in enumerate(order):
        if rank and (mass >= params.top_p or (params.top_k and rank >= params.top_k)):
            break
        kept.append(token)
        mass += p[token]
    out = np.zeros_like(p)
    out[kept] = p[kept]
    return out / out.sum()


def state(params: SamplingParams, prompt: list[int], generated: list[int]) -> SamplingState:
    s = SamplingState(params, VOCAB, prompt)
    for token in generated:
        s.record(token)
    return s


PENALISED = [
    SamplingParams(temperature=0, frequency_penalty=1.5),
    SamplingParams(temperature=0, presence_penalty=-2.0),
    SamplingParams(temperature=0, repetition_penalty=1.8),
    SamplingParams(
        temperature=0,
        frequency_penalty=0.7,
        presence_penalty=0.4,
        repetition_penalty=1.3,
        logit_bias=((3, 5.0), (5, -100.0)),
    ),
]


@pytest.mark.parametrize("params", PENALISED)
def test_penalties_and_bias_match_the_reference_in_one_batch(params: SamplingParams) -> None:
    rng = np.random.default_rng(7)
    logits = rng.normal(0, 3, (6, VOCAB)).astype(np.float32)
    histories = [
        (rng.integers(0, VOCAB, 10).tolist(), rng.integers(0, VOCAB, row * 3).tolist())
        for row in range(6)
    ]
    states = [state(params, p, g) for p, g in histories]
    got = [s.token for s in sample_batch(logits, states)]
    want = [
        int(np.argmax(reference_logits(logits[row], params, *histories[row]))) for row in range(6)
    ]
    assert got == want
    # the penalties really moved the choice somewhere: otherwise this test could not fail
    assert got != [int(np.argmax(row)) for row in logits]


def test_each_row_keeps_its_own_parameters_in_a_mixed_batch() -> None:
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 2, (len(PENALISED), VOCAB))
    histories = [([1, 2, 3], [4, 4, 4, 9]) for _ in PENALISED]
    states = [state(p, *h) for p, h in zip(PENALISED, histories, strict=True)]
    got = [s.token for s in sample_batch(logits, states)]
    want = [
        int(np.argmax(reference_logits(logits[i], p, *histories[i])))
        for i, p in enumerate(PENALISED)
    ]
    assert got == want


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.3, top_k=5),
        SamplingParams(temperature=1.0, top_p=0.6),
        SamplingParams(temperature=0.9, top_k=8, top_p=0.8, frequency_penalty=1.0),
    ],
)
def test_draws_follow_the_reference_distribution(params: SamplingParams) -> None:
    rng = np.random.default_rng(11)
    logits = rng.normal(0, 1.5, VOCAB)
    prompt, generated = [1, 2], [7, 7, 8]
    want = reference_distribution(reference_logits(logits, params, prompt, generated), params)
    draws = 4000
    # one batch of many identical rows, each with its own generator
    states = []
    for seed in range(draws):
        s = state(SamplingParams(**{**vars(params), "seed": seed}), prompt, generated)
        states.append(s)
    tokens = [s.token for s in sample_batch(np.tile(logits, (draws, 1)), states)]
    seen = np.bincount(tokens, minlength=VOCAB) / draws
    assert set(np.flatnonzero(seen)) <= set(np.flatnonzero(want)), "drew a truncated token"
    assert np.abs(seen - want).max() < 0.04


def test_seeded_rows_repeat_and_choices_differ() -> None:
    logits = np.random.default_rng(0).normal(0, 1, (1, VOCAB))
    params = SamplingParams(temperature=1.0, seed=42)

    def draws(offset: int) -> list[int]:
        s = SamplingState(params, VOCAB, (), seed_offset=offset)
        return [sample_batch(logits, [s])[0].token for _ in range(20)]

    assert draws(0) == draws(0)
    assert draws(0) != draws(1)


def test_the_mask_is_never_crossed_and_empty_masks_fail() -> None:
    rng = np.random.default_rng(5)
    logits = rng.normal(0, 1, (4, VOCAB))
    allowed = np.zeros((4, VOCAB), bool)
    allowed[0, [3, 9]] = True
    allowed[1, 60] = True
    allowed[2:] = True
    states = [state(SamplingParams(temperature=1.0, seed=i), [], []) for i in range(4)]
    for _ in range(50):
        tokens = [s.token for s in sample_batch(logits, states, allowed)]
        assert tokens[0] in (3, 9) and tokens[1] == 60
    allowed[3] = False
    with pytest.raises(ValueError, match="allows no token"):
        sample_batch(logits, states, allowed)


def test_logprobs_are_log_softmax_of_the_raw_logits() -> None:
    rng = np.random.default_rng(9)
    logits = rng.normal(0, 4, (3, VOCAB)).astype(np.float32)
    params = [
        SamplingParams(temperature=0.5, seed=1, logprobs=True, top_logprobs=5),
        SamplingParams(temperature=0, logprobs=False),
        SamplingParams(temperature=0, logprobs=True, top_logprobs=20, frequency_penalty=2.0),
    ]
    out = sample_batch(logits, [state(p, [], [2, 2]) for p in params])
    x = logits.astype(np.float64)
    reference = x - np.log(np.exp(x).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(log_softmax(logits), reference, rtol=1e-12, atol=1e-12)
    for row in (0, 2):
        assert out[row].logprob == pytest.approx(reference[row, out[row].token])
        top = out[row].top_logprobs
        assert len(top) == params[row].top_logprobs
        want = np.argsort(-reference[row], kind="stable")[: len(top)]
        assert [t for t, _ in top] == want.tolist()
        assert [lp for _, lp in top] == pytest.approx(reference[row, want].tolist())
    assert out[1].logprob is None and out[1].top_logprobs == ()


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"presence_penalty": -3}, "presence_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"top_k": -1}, "top_k"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"logit_bias": ((1, 101.0),)}, "logit_bias"),
    ],
)
def test_out_of_range_parameters_name_themselves(kwargs: dict, param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**kwargs)
    assert info.value.param == param
