"""`POST /v1/embeddings`: a text-only request and OpenAI's list-of-vectors response, with the
base64 form the `openai` SDK asks for by default."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator

from deployments.ingress.protocol.common import (
    OpenAIRequest,
    ResponseModel,
    as_text_list,
    check_text_inputs,
)

# OpenAI's documented limit on the number of inputs in one request.
MAX_EMBEDDING_INPUTS = 2048

EncodingFormat = Literal["float", "base64"]


class EmbeddingRequest(OpenAIRequest):
    input: str | list[str] = Field(
        description=f"One text or up to {MAX_EMBEDDING_INPUTS} texts; token arrays are refused."
    )
    model: str = Field(min_length=1)
    dimensions: int | None = Field(
        default=None, ge=1, description="If given, must equal the model's dimension."
    )
    encoding_format: EncodingFormat = "float"
    user: str | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _check_input(cls, value: Any) -> Any:
        return check_text_inputs(value, max_items=MAX_EMBEDDING_INPUTS)

    @property
    def texts(self) -> list[str]:
        return as_text_list(self.input)


def encode_embedding_base64(vector: Sequence[float] | np.ndarray) -> str:
    """OpenAI's base64 form: the vector's little-endian float32 bytes, base64-encoded."""
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


class Embedding(ResponseModel):
    """One vector of a `CreateEmbeddingResponse`: the documented schema; bodies are built by
    `EmbeddingList.body`."""

    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(ResponseModel):
    prompt_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)


class CreateEmbeddingResponse(ResponseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


@dataclass(frozen=True, eq=False)  # eq on arrays is ambiguous
class EmbeddingList:
    """A `CreateEmbeddingResponse` before encoding. The vectors stay one float32 matrix from the
    replica to the encoder: a model per vector, validating a Python float per dimension, cost the
    router more CPU than the model spent."""

    vectors: np.ndarray  # one row per input, in input order
    model: str
    prompt_tokens: int
    encoding_format: EncodingFormat = "float"

    def body(self) -> dict[str, Any]:
        """The response as JSON-ready data: float rows stay numpy (the router's encoder writes
        each float32 as the shortest text that reads back as it), base64 rows are strings."""
        encode: Any = encode_embedding_base64 if self.encoding_format == "base64" else _as_float32
        return {
            "object": "list",
            "data": [
                {"object": "embedding", "index": index, "embedding": encode(row)}
                for index, row in enumerate(self.vectors)
            ],
            "model": self.model,
            "usage": {"prompt_tokens": self.prompt_tokens, "total_tokens": self.prompt_tokens},
        }


def _as_float32(row: np.ndarray) -> np.ndarray:
    return np.asarray(row, dtype=np.float32)
