"""Where the moderation gate's classifier runs. An embedded classifier (a vectorizer + linear
graph: a few microseconds a text on a CPU) is loaded into the router itself, from the same
models_dir as its deployment, so a check costs no hop; any other moderation model (a heavy guard
model) is called as its deployment, which also keeps serving /v1/moderations either way."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from deployments.config.security import ModerationGateConfig
from deployments.contracts.encoder_outputs import ModerationResult
from deployments.contracts.manifest import ModelManifest
from deployments.contracts.session_config import SessionConfig
from deployments.ingress.security.moderation_gate import Classify

# The exporter's classical pipelines (deployments.export.moderation names the architecture
# "<vectorizer>+<classifier>"): small, CPU-only graphs.
EMBEDDED_VECTORIZERS = ("TfidfVectorizer+", "CountVectorizer+")
# One thread: a check is a few microseconds, and router replicas share their cores.
ROUTER_SESSION = SessionConfig(provider="cpu", intra_op_threads=1, inter_op_threads=1)


class TextClassifier(Protocol):
    def classify(self, texts: Sequence[str]) -> list[ModerationResult]: ...


# A moderation model directory -> the classifier to run in the router, or None (the deployment).
OpenClassifier = Callable[[Path], TextClassifier | None]


def is_embedded_classifier(manifest: ModelManifest) -> bool:
    return manifest.task == "moderation" and manifest.architecture.startswith(EMBEDDED_VECTORIZERS)


def open_embedded_classifier(model_dir: Path) -> TextClassifier | None:
    """The model in `model_dir` opened here if it is an embedded classifier, else None."""
    if not is_embedded_classifier(ModelManifest.load(model_dir)):
        return None
    # Imported here, not at the top: ONNX Runtime enters the router process only when the gate
    # does run a classifier in it (a router whose gate calls the deployment never loads it).
    from deployments.replica.engine.moderation import ModerationRuntime

    return ModerationRuntime(model_dir, ROUTER_SESSION)


def in_router_classifier(
    gate: ModerationGateConfig,
    model_dir: Path,
    open_classifier: OpenClassifier = open_embedded_classifier,
) -> Classify | None:
    """The gate's classifier as a call in this process, or None where the config or the model
    leaves classifying to the moderation deployment."""
    if not gate.models or gate.classifier == "deployment":
        return None
    classifier = open_classifier(model_dir)
    if classifier is None:
        return None

    async def flags(texts: list[str]) -> list[bool]:
        return [result.flagged for result in classifier.classify(texts)]

    return flags
