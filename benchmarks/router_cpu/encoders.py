"""The router's response encoders against the pydantic-and-json way they replaced: CPU per body
for embeddings (float and base64) and Workers AI envelopes, the same vectors on both sides."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from deployments.ingress.api.responses import encode_json
from deployments.ingress.protocol import (
    CreateEmbeddingResponse,
    Embedding,
    EmbeddingList,
    EmbeddingUsage,
    WorkersEmbeddingResult,
    WorkersEnvelope,
    encode_embedding_base64,
    ok_envelope,
    workers_embedding_result,
)
from deployments.ingress.protocol.embeddings import EncodingFormat

DIMENSION = 384  # all-MiniLM-L6-v2, the default embedding model


def _legacy_json(data: Any) -> bytes:
    """How the router encoded before orjson: Starlette's JSONResponse.render."""
    return json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def legacy_embedding_body(vectors: np.ndarray, encoding_format: EncodingFormat) -> bytes:
    """The embeddings body as the router built it before the fast path (kept only here, for the
    comparison): a pydantic model per vector holding a Python float per dimension, validated,
    dumped, then encoded by the json module."""
    data = [
        Embedding(
            index=index,
            embedding=encode_embedding_base64(row)
            if encoding_format == "base64"
            else np.asarray(row, dtype=np.float32).tolist(),
        )
        for index, row in enumerate(vectors)
    ]
    response = CreateEmbeddingResponse(
        data=data, model="embedding", usage=EmbeddingUsage(prompt_tokens=10, total_tokens=10)
    )
    return _legacy_json(response.model_dump(mode="json", by_alias=True))


def legacy_workers_body(vectors: np.ndarray) -> bytes:
    result = WorkersEmbeddingResult(shape=list(vectors.shape), data=vectors.tolist())
    return _legacy_json(WorkersEnvelope(result=result, success=True).model_dump(mode="json"))


def fast_embedding_body(vectors: np.ndarray, encoding_format: EncodingFormat) -> bytes:
    return encode_json(EmbeddingList(vectors, "embedding", 10, encoding_format).body())


def fast_workers_body(vectors: np.ndarray) -> bytes:
    return encode_json(ok_envelope(workers_embedding_result(vectors)))


def _cpu_us(build: Callable[[], bytes], repeat: int) -> float:
    build()
    started = time.process_time()
    for _ in range(repeat):
        build()
    return (time.process_time() - started) / repeat * 1e6


def encoder_comparison(repeat: int = 300) -> dict[str, Any]:
    """The same vectors through the old and the new body building + encoding, in one run: µs of
    CPU per response body, and the new path's speed-up."""
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {}
    for rows in (1, 32):
        vectors = rng.standard_normal((rows, DIMENSION), dtype=np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        cases: dict[str, tuple[Callable[[], bytes], Callable[[], bytes]]] = {
            f"openai_float_x{rows}": (
                partial(legacy_embedding_body, vectors, "float"),
                partial(fast_embedding_body, vectors, "float"),
            ),
            f"openai_base64_x{rows}": (
                partial(legacy_embedding_body, vectors, "base64"),
                partial(fast_embedding_body, vectors, "base64"),
            ),
            f"workers_x{rows}": (
                partial(legacy_workers_body, vectors),
                partial(fast_workers_body, vectors),
            ),
        }
        for name, (legacy, fast) in cases.items():
            legacy_us, fast_us = _cpu_us(legacy, repeat), _cpu_us(fast, repeat)
            out[name] = {
                "legacy_cpu_us": round(legacy_us, 1),
                "fast_cpu_us": round(fast_us, 1),
                "speedup": round(legacy_us / fast_us, 1),
                "legacy_bytes": len(legacy()),
                "fast_bytes": len(fast()),
            }
    return out
