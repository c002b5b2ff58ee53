"""The moderation classifier: the ONNX export agrees with alt-profanity-check's scikit-learn model,
and the runtime validates, batches and thresholds."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from deployments.contracts.manifest import MANIFEST_NAME, ModelManifest
from deployments.errors import (
    ContextLengthExceededError,
    EmptyInputError,
    InvalidRequestError,
    InvalidUTF8Error,
    ServingError,
)
from deployments.export.common import VerificationError
from deployments.export.moderation import (
    ATOL,
    CLASSIFIER_FILE,
    GRAPH_NAME,
    VECTORIZER_FILE,
    export_moderation,
    load_sklearn_model,
    packaged_model_dir,
    verify_moderation_graph,
)
from deployments.ingress.security import ModerationGateConfig
from deployments.ingress.security.gate_classifier import (
    in_router_classifier,
    open_embedded_classifier,
)
from deployments.replica.engine.moderation import MAX_INPUT_CHARS, ModerationRuntime

REPO = Path(__file__).resolve().parents[2]

OFFENSIVE = "you are a fucking worthless piece of shit"
BENIGN = "Have a lovely afternoon, and thanks again for the book recommendation."

# Independent of the exporter's own VERIFY_TEXTS: casing, Unicode words from the vocabulary,
# stop-word-only and token-free texts, obfuscation and a long mixed paragraph.
SAMPLE_TEXTS = (
    BENIGN,
    OFFENSIVE,
    "The deploy finished at 14:05 UTC; all health checks are green.",
    "What a stupid, stupid idea. Are you dumb?",
    "SHUT UP, MORON!!!",
    "Go to hell",
    "my grandmother bakes the best apple pie",
    "Bitch please",
    "Pokémon cards and a beyoncé concert",
    "見学 連絡",
    "İSTANBUL ΜΕΛΟΣ ŁÓDŹ",
    "the of and",
    "...",
    "x",
    "you suck",
    "a$$hole",
    "Dear team, please find the quarterly report attached. Fucking finally. Regards, Sam",
    "I would like to kill some time before the train leaves.",
)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="session")
def moderation_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("models") / "moderation"
    export_moderation(None, out)
    return out


@pytest.fixture(scope="session")
def runtime(moderation_dir: Path) -> ModerationRuntime:
    return ModerationRuntime(moderation_dir)


def _profane_scores(runtime: ModerationRuntime, texts: list[str]) -> np.ndarray:
    return np.array([r.category_scores["profanity"] for r in runtime.classify(texts)])


def test_scores_agree_with_the_original_sklearn_classifier(runtime: ModerationRuntime) -> None:
    from profanity_check import predict_prob  # the package's own API, not our loader

    texts = list(SAMPLE_TEXTS)
    expected = predict_prob(texts)
    actual = _profane_scores(runtime, texts)

    assert np.max(np.abs(actual - expected)) < ATOL
    np.testing.assert_array_equal(actual >= 0.5, expected >= 0.5)
    assert 0 < np.sum(expected >= 0.5) < len(texts), "the sample must hold both verdicts"


def test_offensive_text_is_flagged_and_benign_is_not(runtime: ModerationRuntime) -> None:
    offensive, benign = runtime.classify([OFFENSIVE, BENIGN])

    assert offensive.flagged
    assert offensive.categories == {"harassment": True, "profanity": True}
    assert not benign.flagged
    assert benign.categories == {"harassment": False, "profanity": False}


def test_the_exported_classifier_is_embedded_in_the_router_and_a_guard_model_is_not(
    moderation_dir: Path, tmp_path: Path
) -> None:
    gate = ModerationGateConfig(models=["glm"])
    flags = in_router_classifier(gate, moderation_dir)
    assert flags is not None
    assert asyncio.run(flags([OFFENSIVE, BENIGN])) == [True, False]
    off = gate.model_copy(update={"classifier": "deployment"})
    assert in_router_classifier(off, moderation_dir) is None
    # Any other architecture (a transformer guard model) stays a call of its deployment, and
    # the router never opens its graph.
    guard = tmp_path / "guard"
    guard.mkdir()
    manifest = ModelManifest.load(moderation_dir).model_copy(
        update={"architecture": "DebertaV2ForSequenceClassification"}
    )
    manifest.write(guard)
    assert open_embedded_classifier(guard) is None


def test_batch_results_keep_input_order(runtime: ModerationRuntime) -> None:
    texts = [BENIGN, OFFENSIVE, "Go to hell", "my grandmother bakes the best apple pie"]

    batched = _profane_scores(runtime, texts)
    one_by_one = np.concatenate([_profane_scores(runtime, [text]) for text in texts])

    np.testing.assert_allclose(batched, one_by_one, atol=1e-6)
    assert [r.flagged for r in runtime.classify(texts)] == [s >= 0.5 for s in one_by_one]


def test_a_stop_word_only_text_keeps_its_row(runtime: ModerationRuntime) -> None:
    # ONNX's StringNormalizer would drop "the" as a whole row and shift the batch.
    results = runtime.classify(["the", OFFENSIVE, "and"])

    assert len(results) == 3
    assert [r.flagged for r in results] == [False, True, False]


def test_scores_are_probabilities_shared_by_both_categories(runtime: ModerationRuntime) -> None:
    for result in runtime.classify(list(SAMPLE_TEXTS)):
        assert set(result.category_scores) == {"harassment", "profanity"}
        assert result.category_scores["harassment"] == result.category_scores["profanity"]
        assert 0.0 <= result.category_scores["profanity"] <= 1.0


@pytest.mark.parametrize(
    ("texts", "error"),
    [
        ([], EmptyInputError),
        ([""], EmptyInputError),
        (["fine", ""], EmptyInputError),
        (["fine", 3], InvalidRequestError),
        ([None], InvalidRequestError),
        ("a bare string, not a list", InvalidRequestError),
        (["broken \ud800 surrogate"], InvalidUTF8Error),
        (["x" * (MAX_INPUT_CHARS + 1)], ContextLengthExceededError),
    ],
)
def test_invalid_input_raises_its_client_error(
    runtime: ModerationRuntime, texts: object, error: type[ServingError]
) -> None:
    with pytest.raises(ServingError) as caught:
        runtime.classify(texts)  # type: ignore[arg-type]

    assert type(caught.value) is error
    assert caught.value.status == 400
    assert caught.value.param == "input"


def test_input_at_the_length_limit_is_accepted(runtime: ModerationRuntime) -> None:
    (result,) = runtime.classify(["a" * MAX_INPUT_CHARS])

    assert not result.flagged


def test_describe_reports_what_health_needs(runtime: ModerationRuntime) -> None:
    info = runtime.describe()

    assert info["task"] == "moderation"
    assert info["provider"] == "cpu"
    assert info["categories"] == ["harassment", "profanity"]
    assert info["input_normalization"] == "lowercase"
    assert info["load_s"] > 0 and info["warmup_s"] > 0


def _export_in_subprocess(out: Path, hash_seed: str) -> None:
    code = (
        "import sys; from pathlib import Path; "
        "from deployments.export.moderation import export_moderation; "
        "export_moderation(None, Path(sys.argv[1]))"
    )
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    subprocess.run([sys.executable, "-c", code, str(out)], check=True, cwd=REPO, env=env)


def test_export_is_byte_identical_across_processes(moderation_dir: Path, tmp_path: Path) -> None:
    # Two string-hash seeds: skl2onnx keeps opset domains in a set, whose order follows the seed.
    for seed in ("0", "1"):
        _export_in_subprocess(tmp_path / seed, seed)

    for name in (GRAPH_NAME, MANIFEST_NAME):
        assert _sha256(tmp_path / "0" / name) == _sha256(moderation_dir / name)
        assert _sha256(tmp_path / "1" / name) == _sha256(moderation_dir / name)


def test_export_from_a_directory_verifies_and_matches(moderation_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    for name in (VECTORIZER_FILE, CLASSIFIER_FILE):
        shutil.copy(packaged_model_dir() / name, source / name)

    manifest = export_moderation(str(source), tmp_path / "out", verify=True)

    assert manifest.source == str(source)
    assert manifest.architecture == "TfidfVectorizer+CalibratedClassifierCV(LinearSVC)"
    assert manifest.files[GRAPH_NAME] == _sha256(moderation_dir / GRAPH_NAME)
    assert ModelManifest.load(tmp_path / "out").verify_files(tmp_path / "out") == []


def test_verification_catches_a_tokenization_mismatch(moderation_dir: Path) -> None:
    vectorizer, classifier = load_sklearn_model(packaged_model_dir())
    case_sensitive = copy.deepcopy(vectorizer).set_params(lowercase=False)

    with pytest.raises(VerificationError):
        verify_moderation_graph(moderation_dir / GRAPH_NAME, case_sensitive, classifier)


def test_export_from_a_directory_without_the_model_fails(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=VECTORIZER_FILE):
        export_moderation(str(tmp_path), tmp_path / "out")
