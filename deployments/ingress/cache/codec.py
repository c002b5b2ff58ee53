"""Cached answers as bytes and back, exactly: a one-byte tag names the type; a pydantic answer is
its JSON, an embedding list a small JSON header and the matrix's raw bytes. Never pickle: a
shared store is writable by more than this process, and unpickling runs whatever it is given."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
from pydantic import BaseModel, ValidationError

from deployments.ingress.protocol import ChatCompletion, ModerationCreateResponse
from deployments.ingress.protocol.embeddings import EmbeddingList

EMBEDDINGS_TAG = b"E"
MODEL_TAGS: dict[bytes, type[BaseModel]] = {b"C": ChatCompletion, b"M": ModerationCreateResponse}
_TAG_OF_MODEL = {model: tag for tag, model in MODEL_TAGS.items()}
_HEADER_SIZE = struct.Struct("<I")


class CodecError(ValueError):
    """Bytes that are no answer this codec wrote (another version's, or damaged)."""


def encode_answer(answer: Any) -> bytes:
    if isinstance(answer, EmbeddingList):
        vectors = np.ascontiguousarray(answer.vectors)
        header = json.dumps(
            {
                "model": answer.model,
                "prompt_tokens": answer.prompt_tokens,
                "encoding_format": answer.encoding_format,
                "dtype": vectors.dtype.str,  # with its byte order: '<f4'
                "shape": vectors.shape,
            },
            separators=(",", ":"),
        ).encode()
        return EMBEDDINGS_TAG + _HEADER_SIZE.pack(len(header)) + header + vectors.tobytes()
    tag = _TAG_OF_MODEL.get(type(answer))
    if tag is None:
        raise TypeError(f"no cache encoding for {type(answer).__name__}")
    return tag + answer.model_dump_json().encode()


def decode_answer(data: bytes) -> Any:
    """The answer `encode_answer` wrote; its vectors are read-only views of `data`, so a cached
    answer cannot be changed by whoever it is served to."""
    tag, body = data[:1], memoryview(data)[1:]
    try:
        if tag == EMBEDDINGS_TAG:
            (size,) = _HEADER_SIZE.unpack_from(body)
            header = json.loads(bytes(body[_HEADER_SIZE.size : _HEADER_SIZE.size + size]))
            matrix = body[_HEADER_SIZE.size + size :]
            vectors = np.frombuffer(matrix, dtype=np.dtype(header["dtype"]))
            return EmbeddingList(
                vectors.reshape(header["shape"]),
                header["model"],
                header["prompt_tokens"],
                header["encoding_format"],
            )
        if tag in MODEL_TAGS:
            return MODEL_TAGS[tag].model_validate_json(data[1:])
    except (struct.error, ValueError, KeyError, TypeError, ValidationError) as error:
        raise CodecError(f"undecodable cache entry ({tag!r}): {error}") from None
    raise CodecError(f"unknown cache entry type {tag!r}")
