"""The router's one JSON encoder (`deployments.ingress.api.responses`): numpy vectors written as
they are and read back as the same float32 values, models and plain data as FastAPI would write
them."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from fastapi.testclient import TestClient
from router_fakes import DIMENSION, app_config, fake_handles, services_for

from deployments.ingress.api.app import make_app
from deployments.ingress.api.responses import encode_json, json_response
from deployments.ingress.protocol import EmbeddingList, ModelCard, Usage

USER_KEY = "sk-user-0123456789abcdef"
USER = {"authorization": f"Bearer {USER_KEY}"}


def test_float32_vectors_read_back_exactly_and_shortest():
    vectors = np.random.default_rng(1).standard_normal((3, 384)).astype(np.float32)
    vectors[0, :4] = [0.1, 1 / 3, 1e-8, 3.4e38]
    text = encode_json({"v": vectors})
    assert np.array_equal(np.array(json.loads(text)["v"], dtype=np.float32), vectors)
    # float32's shortest form, not the float64 expansion of it (0.10000000149011612).
    assert text.startswith(b'{"v":[[0.1,0.33333334,1e-8,3.4e+38,')


def test_arrays_orjson_cannot_write_directly_still_encode():
    matrix = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert json.loads(encode_json(matrix[:, ::2])) == [[0.0, 2.0], [4.0, 6.0], [8.0, 10.0]]
    assert json.loads(encode_json(np.array([1.5, 2.5], dtype=np.float16))) == [1.5, 2.5]
    assert json.loads(encode_json({"a": np.float32(0.5), "b": np.int64(3)})) == {"a": 0.5, "b": 3}
    with pytest.raises(TypeError):
        encode_json({"a": object()})


def test_models_and_lists_of_models_encode_as_their_json_dump():
    card = ModelCard(id="minilm", created=0, task="embedding", family="bert")
    assert json.loads(encode_json(card)) == card.model_dump(mode="json")
    assert json.loads(encode_json([Usage.from_counts(1, 2)])) == [
        {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    ]
    response = json_response({"é": "ü"}, {"x-edge-colo": "fra"}, status=201)
    assert (response.status_code, response.headers["x-edge-colo"]) == (201, "fra")
    assert response.headers["content-type"] == "application/json"
    assert response.body == '{"é":"ü"}'.encode()  # UTF-8, not \\u escapes, as before


def test_base64_rows_are_the_little_endian_float32_bytes():
    vectors = np.random.default_rng(2).standard_normal((2, 8)).astype(np.float32)
    body = EmbeddingList(vectors, "minilm", 4, "base64").body()
    rows = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in body["data"]]
    assert np.array_equal(np.stack(rows), vectors)
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert body["usage"] == {"prompt_tokens": 4, "total_tokens": 4}


@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_the_embeddings_route_sends_the_replicas_vectors(encoding):
    config = app_config()
    services = services_for(config, fake_handles(), {"EDGE_API_KEYS": f"alice:{USER_KEY}"})
    expected = np.tile(np.arange(DIMENSION, dtype=np.float32) / 10, (2, 1))  # the fake's rows
    with TestClient(make_app(config, services)) as client:
        request = {"model": "embedding", "input": ["a", "b"], "encoding_format": encoding}
        response = client.post("/v1/embeddings", json=request, headers=USER)
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    data = response.json()["data"]
    if encoding == "base64":
        rows = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in data]
    else:
        rows = [np.array(d["embedding"], dtype=np.float32) for d in data]
    assert np.array_equal(np.stack(rows), expected)
