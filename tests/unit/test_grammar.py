"""Schema -> grammar -> token masks: every sampled continuation parses and validates, even when
tokens are drawn at random from the mask and the budget runs out."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from deployments.contracts.manifest import ModelManifest
from deployments.errors import InvalidRequestError
from deployments.replica.engine.grammar import GrammarCompiler, GrammarConstraint

MODELS = Path(__file__).resolve().parents[2] / "models"

PET = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "kind": {"enum": ["cat", "dog", "axolotl"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "owner": {
            "type": "object",
            "properties": {"age": {"type": "integer"}, "verified": {"type": "boolean"}},
            "required": ["age", "verified"],
            "additionalProperties": False,
        },
        "weight": {"type": "number"},
    },
    "required": ["name", "kind", "tags", "owner", "weight"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module", params=["glm", "kimi"])
def compiler(request: pytest.FixtureRequest) -> GrammarCompiler:
    manifest = ModelManifest.load(MODELS / request.param)
    assert manifest.llm is not None
    return GrammarCompiler(
        MODELS / request.param / "tokenizer.json", manifest.llm.eos_token_ids, manifest.vocab_size
    )


def random_walk(
    compiler: GrammarCompiler, constraint: GrammarConstraint, budget: int, seed: int
) -> tuple[str, bool]:
    """Draw uniformly among allowed tokens (a model with no idea) until the end or the budget;
    returns the text and whether it ended by itself (not by running out)."""
    rng = np.random.default_rng(seed)
    tokens: list[int] = []
    while len(tokens) < budget:
        token = int(rng.choice(np.flatnonzero(constraint.allowed(budget - len(tokens)))))
        if token in compiler.eos_token_ids:
            return compiler.tokenizer.decode_str(tokens), True
        constraint.accept(token)
        tokens.append(token)
        if constraint.done:
            return compiler.tokenizer.decode_str(tokens), True
    return compiler.tokenizer.decode_str(tokens), False


@pytest.mark.parametrize("budget", [64, 160])
def test_every_random_continuation_validates_against_the_schema(
    compiler: GrammarCompiler, budget: int
) -> None:
    for seed in range(12):
        text, ended = random_walk(compiler, compiler.json_schema(PET), budget, seed)
        assert ended, f"ran out of budget: {text!r}"
        jsonschema.validate(json.loads(text), PET)


def test_json_object_mode_gives_an_object(compiler: GrammarCompiler) -> None:
    for seed in range(8):
        text, ended = random_walk(compiler, compiler.json_schema(None), 40, seed)
        assert ended and isinstance(json.loads(text), dict), text


def test_the_closing_path_fits_only_a_budget_that_holds_it(compiler: GrammarCompiler) -> None:
    shortest = compiler.json_schema(PET).closing_cost()
    assert 10 < shortest < 64
    text, ended = random_walk(compiler, compiler.json_schema(PET), shortest // 2, 0)
    assert not ended
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


def test_lark_grammars_embed_json_schemas(compiler: GrammarCompiler) -> None:
    grammar = 'start: "call:" %json{"type": "object", "properties": {"x": {"type": "integer"}}, '
    grammar += '"required": ["x"], "additionalProperties": false}'
    text, ended = random_walk(compiler, compiler.lark(grammar, "tools"), 30, 3)
    assert ended and text.startswith("call:")
    assert isinstance(json.loads(text.removeprefix("call:"))["x"], int)


def test_a_schema_the_grammar_cannot_hold_is_a_client_error(compiler: GrammarCompiler) -> None:
    with pytest.raises(InvalidRequestError) as info:
        compiler.json_schema({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}})
    assert info.value.param == "response_format"
