"""Export a scikit-learn text classifier (alt-profanity-check's TF-IDF + calibrated LinearSVC by
default) to one ONNX graph: a string tensor [N] in, class probabilities `scores` [N, 2] out."""

from __future__ import annotations

import copy
import importlib.metadata
import importlib.resources
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import joblib
import numpy as np
import onnx
import onnx.utils
from skl2onnx import convert_sklearn
from skl2onnx.common.data_types import FloatTensorType, Int64TensorType, StringTensorType
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.pipeline import Pipeline

from deployments.contracts.manifest import ModelManifest, ModerationSpec
from deployments.export.common import VerificationError, fresh_dir, max_abs_diff
from deployments.replica.engine.moderation import (
    INPUT_NORMALIZATION_KEY,
    SCORES_OUTPUT,
    graph_normalization,
    normalize_texts,
)
from deployments.replica.engine.session import SessionConfig, open_session

log = logging.getLogger(__name__)

PACKAGED_DISTRIBUTION = "alt-profanity-check"
PACKAGED_MODULE = "profanity_check"
VECTORIZER_FILE = "vectorizer.joblib"
CLASSIFIER_FILE = "model.joblib"
GRAPH_NAME = "model.onnx"
INPUT_NAME = "input"
TARGET_OPSET = MappingProxyType({"": 17, "ai.onnx.ml": 3})

# The classifier has one decision: column 1 of `scores` is the calibrated probability of the
# positive ("profane") class, column 0 its complement. OpenAI's API has no `profanity` category, so
# its closest one, `harassment`, is mapped from that same probability; both flag at one threshold.
POSITIVE_COLUMN = 1
CATEGORIES = MappingProxyType({"harassment": POSITIVE_COLUMN, "profanity": POSITIVE_COLUMN})
THRESHOLD = 0.5

# float32 TF-IDF and linear scores in ONNX against float64 in scikit-learn.
ATOL = 1e-4

# scikit-learn's default word pattern. ONNX Runtime's Tokenizer runs RE2, whose `\w` and `\b` are
# ASCII-only, so skl2onnx's own substitute `[a-zA-Z0-9_]+` splits "pokémon" into "pok" + "mon".
# Python's Unicode `\w` is exactly the letters, numbers and `_` (checked over every code point), and
# `\b\w\w+\b` finds the maximal runs of two or more of them, which RE2 writes as below.
SKLEARN_TOKEN_PATTERN = r"(?u)\b\w\w+\b"
RE2_TOKEN_PATTERN = r"[\pL\pN_]{2,}"

# Offensive, benign, punctuation, casing, Unicode (including the vocabulary's non-ASCII words) and
# texts with no token at all, whose score is the classifier's intercept alone.
VERIFY_TEXTS = (
    "Have a wonderful day at the park with your family.",
    "The meeting is moved to 3pm on Thursday.",
    "Thanks so much for your help yesterday!",
    "I love this song, it reminds me of summer.",
    "Could you please review my pull request?",
    "The weather in Lisbon is lovely this time of year.",
    "You are a fucking idiot.",
    "shut up you stupid bitch",
    "What the hell is wrong with you, asshole?",
    "this is bullshit",
    "go fuck yourself",
    "You're such a dumbass lol",
    "FUCK THIS SHIT",
    "ShIt HaPpEnS",
    "don't be a dick about it",
    "f*ck you and your st*pid ideas",
    "He's a kind, generous person.",
    "I hate Mondays.",
    "Kill the process with SIGTERM before restarting the server.",
    "the and of to in",
    "a",
    "",
    "   ",
    "\n\t",
    "!!!",
    "?!?! ... ,,, ;;;",
    "12345 67890",
    "snake_case_identifier and __dunder__",
    "naïve café résumé",
    "Pokémon José Beyoncé",
    "POKÉMON JOSÉ BEYONCÉ",
    "連絡 見学 迷惑",
    "ΜΕΛ ετητης",
    "Привет, как дела?",
    "İstanbul STRASSE Straße",
    "emoji only 😀🔥👍",
    "you 💩 idiot",
    "Mixed: hello, WORLD! (fuck) [test] {ok} <tag>",
    "word " * 50,
    "This sentence is long and perfectly polite, describing the quiet routine of a librarian "
    "who catalogues books every morning and waters the plants in the reading room at noon.",
)


def packaged_model_dir() -> Path:
    """The joblib files inside the installed alt-profanity-check wheel."""
    data_dir = Path(str(importlib.resources.files(PACKAGED_MODULE) / "data"))
    if not (data_dir / CLASSIFIER_FILE).is_file():
        raise FileNotFoundError(
            f"{data_dir} has no {CLASSIFIER_FILE}; reinstall {PACKAGED_DISTRIBUTION} "
            "(it is in the `export` extra)"
        )
    return data_dir


def load_sklearn_model(source_dir: Path) -> tuple[CountVectorizer, Any]:
    """The fitted vectorizer and probabilistic binary classifier saved in `source_dir`.

    joblib unpickles, which runs code: only point this at directories you trust.
    """
    paths = [source_dir / VECTORIZER_FILE, source_dir / CLASSIFIER_FILE]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"{source_dir} lacks {', '.join(missing)}")
    vectorizer, classifier = (joblib.load(p) for p in paths)
    if not isinstance(vectorizer, CountVectorizer):
        raise TypeError(
            f"{paths[0]} holds a {type(vectorizer).__name__}, not a Count/TfidfVectorizer"
        )
    if not hasattr(classifier, "predict_proba") or len(getattr(classifier, "classes_", ())) != 2:
        raise TypeError(f"{paths[1]} must hold a fitted binary classifier with predict_proba")
    return vectorizer, classifier


def _graph_vectorizer(vectorizer: CountVectorizer) -> tuple[CountVectorizer, str]:
    """A copy the graph can reproduce exactly, and the normalisation the runtime must apply first.

    skl2onnx would lowercase with ONNX Runtime's StringNormalizer, which needs the en_US.UTF-8
    C++ locale (absent from slim images: the session fails to load) and would drop stop words as
    whole input strings, so a batch holding the text "the" loses a row. Stop words never reach the
    vocabulary, so the graph ignores them anyway; lowercasing moves to the runtime (`str.lower`,
    which is what scikit-learn runs).
    """
    if vectorizer.analyzer != "word" or vectorizer.token_pattern != SKLEARN_TOKEN_PATTERN:
        raise NotImplementedError(
            "only word analyzers with scikit-learn's default token_pattern have a checked RE2 "
            f"equivalent; got analyzer={vectorizer.analyzer!r}, "
            f"token_pattern={vectorizer.token_pattern!r}"
        )
    if vectorizer.tokenizer is not None or vectorizer.preprocessor is not None:
        raise NotImplementedError("custom tokenizer/preprocessor callables cannot become ONNX")
    if vectorizer.strip_accents is not None:
        raise NotImplementedError("strip_accents has no ONNX equivalent")
    counted_stop_words = set(vectorizer.get_stop_words() or ()) & vectorizer.vocabulary_.keys()
    if counted_stop_words:
        raise NotImplementedError(
            f"stop words in the vocabulary would be counted by the graph: "
            f"{sorted(counted_stop_words)[:5]}"
        )
    graph_vectorizer = copy.deepcopy(vectorizer)
    graph_vectorizer.set_params(lowercase=False, stop_words=None)
    return graph_vectorizer, "lowercase" if vectorizer.lowercase else "none"


def convert_to_onnx(vectorizer: CountVectorizer, classifier: Any) -> onnx.ModelProto:
    """Vectorizer + classifier as one graph: string `input` [N] -> float32 `scores` [N, 2]."""
    graph_vectorizer, normalization = _graph_vectorizer(vectorizer)
    pipeline = Pipeline([("vectorizer", graph_vectorizer), ("classifier", classifier)])
    converted = convert_sklearn(
        pipeline,
        name="moderation",  # the default is a random uuid, which breaks byte-identical builds
        initial_types=[(INPUT_NAME, StringTensorType([None]))],
        final_types=[
            ("label", Int64TensorType([None])),
            (SCORES_OUTPUT, FloatTensorType([None, 2])),
        ],
        options={
            id(graph_vectorizer): {"tokenexp": RE2_TOKEN_PATTERN},
            id(classifier): {"zipmap": False},  # a plain tensor, not a list of dicts
        },
        target_opset=dict(TARGET_OPSET),
    )
    # Thresholds live in the manifest, so the label output and its initializers are dead weight.
    model = onnx.utils.Extractor(converted).extract_model([INPUT_NAME], [SCORES_OUTPUT])
    model.graph.name = converted.graph.name
    # skl2onnx collects the opset domains in a set: fix their order so the bytes do not depend on
    # the interpreter's string hash seed.
    opsets = sorted(model.opset_import, key=lambda opset: opset.domain)
    del model.opset_import[:]
    model.opset_import.extend(opsets)
    onnx.helper.set_model_props(model, {INPUT_NORMALIZATION_KEY: normalization})
    onnx.checker.check_model(model, full_check=True)
    return model


def positive_probability(
    vectorizer: CountVectorizer, classifier: Any, texts: Sequence[str]
) -> np.ndarray:
    """The reference: scikit-learn's own probability of the positive class, in float64."""
    return classifier.predict_proba(vectorizer.transform(list(texts)))[:, POSITIVE_COLUMN]


def verify_moderation_graph(
    graph: Path,
    vectorizer: CountVectorizer,
    classifier: Any,
    texts: Sequence[str] = VERIFY_TEXTS,
    atol: float = ATOL,
) -> float:
    """Max abs difference of the graph's positive probability from scikit-learn's over `texts`;
    raises VerificationError past `atol` or on any flag decision that differs."""
    session = open_session(graph, SessionConfig(provider="cpu"))
    feeds = {INPUT_NAME: normalize_texts(texts, graph_normalization(session))}
    scores = session.run(feeds)[SCORES_OUTPUT]
    actual = scores[:, POSITIVE_COLUMN]
    expected = positive_probability(vectorizer, classifier, texts)
    diff = max_abs_diff(actual, expected)
    if not diff <= atol:  # also catches NaN
        worst = int(np.argmax(np.abs(actual.astype(np.float64) - expected)))
        raise VerificationError(
            f"moderation scores: max abs diff {diff:.3g} exceeds {atol:g} "
            f"(worst: {texts[worst]!r}, onnx {actual[worst]:.6f}, sklearn {expected[worst]:.6f})"
        )
    flips = [
        t
        for t, a, e in zip(texts, actual, expected, strict=True)
        if (a >= THRESHOLD) != (e >= THRESHOLD)
    ]
    if flips:
        raise VerificationError(f"moderation flags differ from scikit-learn on {flips!r}")
    return diff


def _architecture(vectorizer: CountVectorizer, classifier: Any) -> str:
    inner = getattr(classifier, "estimator", None)
    wrapped = f"({type(inner).__name__})" if inner is not None else ""
    return f"{type(vectorizer).__name__}+{type(classifier).__name__}{wrapped}"


def export_moderation(source: str | None, out: Path, *, verify: bool = False) -> ModelManifest:
    """Write a moderation model directory (model.onnx + manifest.json) to `out`.

    `source` is a directory holding vectorizer.joblib and model.joblib; None takes the ones shipped
    in alt-profanity-check.
    """
    start = time.perf_counter()
    if source is None:
        source_dir = packaged_model_dir()
        source_name = (
            f"{PACKAGED_DISTRIBUTION}=={importlib.metadata.version(PACKAGED_DISTRIBUTION)}"
        )
    else:
        source_dir, source_name = Path(source), str(source)
    vectorizer, classifier = load_sklearn_model(source_dir)
    model = convert_to_onnx(vectorizer, classifier)

    out = fresh_dir(out)
    onnx.save_model(model, out / GRAPH_NAME)
    if verify:
        diff = verify_moderation_graph(out / GRAPH_NAME, vectorizer, classifier)
        log.info("moderation: ONNX vs scikit-learn max abs diff %.3g", diff)

    manifest = ModelManifest(
        name="moderation",
        task="moderation",
        family="profanity-check",
        architecture=_architecture(vectorizer, classifier),
        source=source_name,
        graph=GRAPH_NAME,
        tokenizer=None,  # tokenization is inside the graph
        moderation=ModerationSpec(categories=dict(CATEGORIES), threshold=THRESHOLD),
    )
    manifest = manifest.write(out)
    log.info("moderation: exported to %s in %.2fs", out, time.perf_counter() - start)
    return ModelManifest.load(out)
