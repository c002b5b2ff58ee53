"""The embedded default models: built locally, deterministically, with no download and no GPU."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from deployments.export.revisions import CHAT_DEFAULT_REVISION

DEFAULT_MODELS = ("glm", "kimi", "embedding", "moderation")
CHAT_DEFAULTS = ("glm", "kimi")


def is_built(root: Path, name: str) -> bool:
    """Whether root/name holds an intact build of the default `name` as this exporter makes it."""
    from deployments.contracts.manifest import ModelManifest

    try:
        manifest = ModelManifest.load(root / name)
    except (FileNotFoundError, ValueError):
        return False
    if manifest.verify_files(root / name):
        return False
    return name not in CHAT_DEFAULTS or manifest.source.endswith(CHAT_DEFAULT_REVISION)


def build_default(name: str, root: Path) -> None:
    # Exporters import torch/transformers/sklearn: import only the one needed.
    out = Path(root) / name
    if name in CHAT_DEFAULTS:
        from deployments.export.llm import export_llm

        export_llm(name, None, out)  # type: ignore[arg-type]
    elif name == "embedding":
        from deployments.export.embedding import export_embedding

        export_embedding(None, out)
    elif name == "moderation":
        from deployments.export.moderation import export_moderation

        export_moderation(None, out)
    else:
        raise ValueError(f"unknown default model {name!r}; expected one of {DEFAULT_MODELS}")


def build_defaults(root: str | Path, only: Iterable[str] | None = None) -> list[str]:
    """Build each default model into root/<name>; returns the names built."""
    names = list(only) if only is not None else list(DEFAULT_MODELS)
    for name in names:
        build_default(name, Path(root))
    return names
