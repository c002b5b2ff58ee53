"""Text moderation on an exported classifier graph: validate the texts, normalise them the way the
graph expects, score them all in one ONNX Runtime run and threshold each category."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from deployments.contracts.encoder_outputs import ModerationResult
from deployments.contracts.manifest import ModelManifest, ModerationSpec
from deployments.errors import (
    ContextLengthExceededError,
    EmptyInputError,
    InvalidRequestError,
    InvalidUTF8Error,
)
from deployments.replica.engine.session import OnnxSession, SessionConfig, open_session

# A moderation input is a message, not a document; past this the vectorizer's cost grows with no
# gain in signal, and a request this large is more likely abuse than content.
MAX_INPUT_CHARS = 32_768

SCORES_OUTPUT = "scores"

# The graph's metadata names the text normalisation it expects before its own tokenizer runs.
# ONNX Runtime's StringNormalizer lowercases through a C++ locale that many images lack
# (en_US.UTF-8), so the exporter leaves lowercasing to Python, which is also what scikit-learn
# itself runs (`str.lower`, final-sigma and all).
INPUT_NORMALIZATION_KEY = "input_normalization"
NORMALIZERS: Mapping[str, Callable[[str], str]] = MappingProxyType(
    {"none": lambda text: text, "lowercase": str.lower}
)

_WARM_UP_TEXT = "warm up the moderation graph"


def normalize_texts(texts: Sequence[str], normalization: str) -> np.ndarray:
    """The graph's string input [N] for `texts`, normalised as its metadata asks."""
    try:
        normalize = NORMALIZERS[normalization]
    except KeyError:
        raise ValueError(
            f"unknown {INPUT_NORMALIZATION_KEY} {normalization!r}; known: {sorted(NORMALIZERS)}"
        ) from None
    return np.array([normalize(text) for text in texts], dtype=object).reshape(len(texts))


def validate_texts(texts: Sequence[str], max_chars: int = MAX_INPUT_CHARS) -> None:
    """Raise the client error for the first bad input; the messages name its index."""
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise InvalidRequestError("input must be a list of strings", param="input")
    if not texts:
        raise EmptyInputError("input must not be empty", param="input")
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidRequestError(
                f"input[{index}] must be a string, got {type(text).__name__}", param="input"
            )
        if not text:
            raise EmptyInputError(f"input[{index}] is an empty string", param="input")
        if len(text) > max_chars:
            raise ContextLengthExceededError(
                f"input[{index}] has {len(text)} characters; the limit is {max_chars}",
                param="input",
            )
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            # Lone surrogates: what a client's broken UTF-16 or a JSON "\ud800" escape decodes to.
            raise InvalidUTF8Error(
                f"input[{index}] is not valid Unicode (lone surrogate at {error.start})",
                param="input",
            ) from None


def graph_normalization(session: OnnxSession) -> str:
    """The input normalisation a moderation graph declares ("none" when it declares nothing)."""
    metadata = session.session.get_modelmeta().custom_metadata_map
    return str(metadata.get(INPUT_NORMALIZATION_KEY, "none"))


class ModerationRuntime:
    """A moderation model directory opened for inference; `classify` keeps no per-call state."""

    def __init__(self, model_dir: str | Path, session_config: SessionConfig | None = None):
        self.model_dir = Path(model_dir)
        self.manifest = ModelManifest.load(self.model_dir)
        if self.manifest.task != "moderation" or self.manifest.moderation is None:
            raise ValueError(
                f"{self.model_dir} holds a {self.manifest.task!r} model, not a moderation model"
            )
        self.spec: ModerationSpec = self.manifest.moderation
        # The graph's ops (Tokenizer, TfIdfVectorizer, LinearClassifier) exist only on CPU, so
        # "auto" would put a GPU in front of a CPU graph for nothing but copies.
        config = session_config or SessionConfig(provider="cpu")
        self.session = open_session(self.model_dir / self.manifest.graph, config)
        self.normalization = graph_normalization(self.session)
        self._check_graph()
        self.load_s = self.session.load_s
        self.warmup_s = self.session.warm_up(
            {self.session.input_names[0]: normalize_texts([_WARM_UP_TEXT], self.normalization)}
        )
        self.provider = self.session.provider

    def _check_graph(self) -> None:
        inputs = self.session.input_names
        if len(inputs) != 1 or self.session.input_type(inputs[0]) != "tensor(string)":
            raise ValueError(f"{self.model_dir}: the graph must take one string tensor")
        if SCORES_OUTPUT not in self.session.output_names:
            raise ValueError(f"{self.model_dir}: the graph has no {SCORES_OUTPUT!r} output")
        if self.normalization not in NORMALIZERS:
            raise ValueError(
                f"{self.model_dir}: unknown {INPUT_NORMALIZATION_KEY} {self.normalization!r}"
            )

    def check(self, texts: Sequence[str]) -> None:
        """Validate a request without running the model (the server checks before batching)."""
        validate_texts(texts)

    def classify(self, texts: Sequence[str]) -> list[ModerationResult]:
        """Score every text in one batched run; results are in input order."""
        validate_texts(texts)
        feeds = {self.session.input_names[0]: normalize_texts(texts, self.normalization)}
        scores = self.session.run(feeds)[SCORES_OUTPUT]
        if scores.shape[0] != len(texts):
            raise RuntimeError(f"the graph returned {scores.shape[0]} rows for {len(texts)} texts")
        return [self._result(row) for row in scores]

    def _result(self, row: np.ndarray) -> ModerationResult:
        category_scores = {name: float(row[col]) for name, col in self.spec.categories.items()}
        categories = {name: score >= self.spec.threshold for name, score in category_scores.items()}
        return ModerationResult(
            flagged=any(categories.values()),
            categories=categories,
            category_scores=category_scores,
        )

    def describe(self) -> dict[str, Any]:
        """What a health or models endpoint reports about this runtime."""
        return {
            "name": self.manifest.name,
            "task": self.manifest.task,
            "family": self.manifest.family,
            "architecture": self.manifest.architecture,
            "source": self.manifest.source,
            "provider": self.provider,
            "load_s": self.load_s,
            "warmup_s": self.warmup_s,
            "categories": sorted(self.spec.categories),
            "threshold": self.spec.threshold,
            "max_input_chars": MAX_INPUT_CHARS,
            "input_normalization": self.normalization,
        }
