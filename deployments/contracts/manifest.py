"""The manifest of a servable model directory: what the graph is, how to feed it, file hashes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1

Task = Literal["chat", "embedding", "moderation"]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


CacheLayout = Literal["concat", "slots"]
Quantization = Literal["int8", "int4"]


class KVCacheLayout(_Frozen):
    """How the decoder graph takes (`past_key_values.{i}.key|value`) and returns (`present.{i}.*`)
    its cache: one [batch, kv_heads, seq, head_dim] tensor per layer for keys and for values.

    `concat` (the plain export): the graph returns the cache one position longer, and takes an
    attention mask and positions. `slots` (`--attention fused`): past and present are one
    preallocated [slots, kv_heads, capacity, head_dim] buffer bound to both (a token writes one
    position in place), and the graph takes `seqlens_k` and `total_seq_len` instead."""

    layout: CacheLayout = "concat"
    num_layers: int
    num_kv_heads: int
    key_head_dim: int
    value_head_dim: int
    past_key_template: str = "past_key_values.{layer}.key"
    past_value_template: str = "past_key_values.{layer}.value"
    present_key_template: str = "present.{layer}.key"
    present_value_template: str = "present.{layer}.value"

    def past_names(self, layer: int) -> tuple[str, str]:
        return (
            self.past_key_template.format(layer=layer),
            self.past_value_template.format(layer=layer),
        )

    def present_names(self, layer: int) -> tuple[str, str]:
        return (
            self.present_key_template.format(layer=layer),
            self.present_value_template.format(layer=layer),
        )


class LLMSpec(_Frozen):
    context_length: int = Field(gt=0)
    eos_token_ids: list[int]
    bos_token_id: int | None = None
    pad_token_id: int = 0
    chat_template: str
    special_tokens: dict[str, int] = Field(default_factory=dict)
    kv_cache: KVCacheLayout


class EmbeddingSpec(_Frozen):
    dimension: int
    max_length: int = Field(gt=0)
    pooling: Literal["mean"] = "mean"
    normalized: bool = True


class ModerationSpec(_Frozen):
    # Each category is read from one column of the graph's `scores` output.
    categories: dict[str, int]
    threshold: float = Field(default=0.5, ge=0.0, le=1.0)


class ModelManifest(_Frozen):
    format_version: int = FORMAT_VERSION
    name: str
    task: Task
    family: str
    architecture: str
    source: str
    dtype: Literal["fp32", "fp16"] = "fp32"
    # int8 of the concat layout is quantize_dynamic; of the slots layout MatMulNBits (int4 too).
    quantization: Quantization | None = None
    graph: str = "model.onnx"
    cpu_prepacked_graph: str | None = Field(
        default=None,
        description="`graph` optimised for the CPU provider with its MatMul weights prepacked "
        "into its data file: open it with graph optimisation off, and the weights are mapped "
        "(shared between replicas) instead of packed into each process's memory",
    )
    tokenizer: str | None = "tokenizer.json"
    vocab_size: int | None = None
    llm: LLMSpec | None = None
    embedding: EmbeddingSpec | None = None
    moderation: ModerationSpec | None = None
    files: dict[str, str] = Field(default_factory=dict, description="path -> sha256")

    @classmethod
    def load(cls, model_dir: str | Path) -> ModelManifest:
        path = Path(model_dir) / MANIFEST_NAME
        if not path.is_file():
            raise FileNotFoundError(
                f"{model_dir} is not a model directory (no {MANIFEST_NAME}); "
                "build the defaults with `make models` or export one with "
                "`python -m deployments.export`"
            )
        return cls.model_validate_json(path.read_text())

    def write(self, model_dir: str | Path) -> ModelManifest:
        """Hash every file in the directory, write the manifest last, and return it."""
        model_dir = Path(model_dir)
        hashed = self.model_copy(update={"files": hash_files(model_dir)})
        text = json.dumps(hashed.model_dump(mode="json"), indent=2, sort_keys=True)
        (model_dir / MANIFEST_NAME).write_text(text + "\n")
        return hashed

    def verify_files(self, model_dir: str | Path) -> list[str]:
        """Names of files whose content no longer matches the manifest (empty when intact)."""
        actual = hash_files(Path(model_dir))
        return sorted(n for n, digest in self.files.items() if actual.get(n) != digest)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def hash_files(model_dir: Path) -> dict[str, str]:
    return {
        str(p.relative_to(model_dir)): sha256_file(p)
        for p in sorted(model_dir.rglob("*"))
        if p.is_file() and p.name != MANIFEST_NAME
    }
