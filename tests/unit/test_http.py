"""The router's HTTP plumbing on a tiny FastAPI app (no Ray): body limit and OpenAI error bodies.
The Workers-AI envelope on the real routes is tested in test_router_api."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Annotated, Any

import pytest
from fastapi import Body, FastAPI, Request
from fastapi.testclient import TestClient

from deployments.errors import (
    InternalServerError,
    ModelNotFoundError,
    ModelNotReadyError,
    OverloadedError,
    ServingError,
)
from deployments.ingress.api.body_limit import BodyLimitMiddleware
from deployments.ingress.api.errors import ErrorShapes, install_error_handler
from deployments.ingress.edge.calls import as_serving_error
from deployments.ingress.protocol import EmbeddingRequest

LIMIT = 2048
SECRET = "do-not-leak-4f1c"  # what a bug's exception says; a client must never see it


def build_app(reached: list[str]) -> FastAPI:
    app = FastAPI()
    shapes = ErrorShapes({})
    install_error_handler(app, shapes)
    app.add_middleware(BodyLimitMiddleware, limit=LIMIT, shapes=shapes)

    @app.post("/echo")
    async def echo(body: Annotated[dict[str, Any], Body()]) -> dict[str, int]:
        reached.append("echo")
        return {"keys": len(body)}

    @app.post("/raw")
    async def raw(request: Request) -> dict[str, int]:
        reached.append("raw")
        return {"bytes": len(await request.body())}

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest) -> dict[str, int]:
        reached.append("embeddings")
        return {"texts": len(body.texts)}

    @app.get("/overloaded")
    async def overloaded() -> None:
        raise OverloadedError("the queue is full", retry_after_s=2.5)

    @app.get("/not-ready")
    async def not_ready() -> None:
        raise ModelNotReadyError("glm is starting", retry_after_s=0.2)

    @app.get("/missing-model")
    async def missing_model() -> None:
        raise ModelNotFoundError("no model 'gpt'", param="model")

    @app.get("/bug")
    async def bug() -> None:
        raise RuntimeError(f"internal detail {SECRET}")

    return app


@pytest.fixture
def reached() -> list[str]:
    return []


@pytest.fixture
def client(reached: list[str]) -> Iterator[TestClient]:
    # raise_server_exceptions=False: answer as a server would, instead of re-raising a 500's cause.
    with TestClient(build_app(reached), raise_server_exceptions=False) as test_client:
        yield test_client


def json_of_size(size: int) -> bytes:
    """A JSON object of exactly `size` bytes."""
    skeleton = b'{"x":""}'
    body = b'{"x":"' + b"a" * (size - len(skeleton)) + b'"}'
    assert len(body) == size
    return body


def chunks(body: bytes, size: int = 512) -> Iterator[bytes]:
    """A generator body: httpx sends it chunked, without Content-Length."""
    for start in range(0, len(body), size):
        yield body[start : start + size]


def assert_openai_error(response: Any, status: int, error_type: str) -> dict[str, Any]:
    assert response.status_code == status
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert list(body) == ["error"]
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == error_type and error["message"]
    return error


# ---- body limit --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/echo", "/raw"])
def test_a_declared_body_over_the_limit_is_413_before_the_route(
    client: TestClient, reached: list[str], path: str
):
    response = client.post(
        path, content=json_of_size(LIMIT + 1), headers={"content-type": "application/json"}
    )
    error = assert_openai_error(response, 413, "invalid_request_error")
    assert error["code"] == "payload_too_large"
    assert str(LIMIT) in error["message"]
    assert reached == []


@pytest.mark.parametrize("path", ["/echo", "/raw"])
def test_a_chunked_body_over_the_limit_is_413(client: TestClient, reached: list[str], path: str):
    body = json_of_size(LIMIT * 3)
    response = client.post(path, content=chunks(body), headers={"content-type": "application/json"})
    error = assert_openai_error(response, 413, "invalid_request_error")
    assert error["code"] == "payload_too_large"
    assert str(LIMIT) in error["message"]
    # A route that reads the body itself has started by then; a parsed body never reaches one.
    assert reached == ([] if path == "/echo" else ["raw"])


def test_the_chunked_request_really_had_no_content_length(client: TestClient):
    request = client.build_request("POST", "/raw", content=chunks(b"abc"))
    assert "content-length" not in request.headers
    assert request.headers["transfer-encoding"] == "chunked"


@pytest.mark.parametrize("size", [8, LIMIT - 1, LIMIT])
def test_a_body_up_to_the_limit_passes(client: TestClient, reached: list[str], size: int):
    body = json_of_size(size)
    declared = client.post("/raw", content=body)
    assert declared.status_code == 200 and declared.json() == {"bytes": size}
    streamed = client.post("/raw", content=chunks(body))
    assert streamed.status_code == 200 and streamed.json() == {"bytes": size}
    parsed = client.post("/echo", content=body, headers={"content-type": "application/json"})
    assert parsed.status_code == 200 and parsed.json() == {"keys": 1}
    assert reached == ["raw", "raw", "echo"]


def test_one_byte_over_the_limit_is_refused_either_way(client: TestClient):
    body = json_of_size(LIMIT + 1)
    assert client.post("/raw", content=body).status_code == 413
    assert client.post("/raw", content=chunks(body)).status_code == 413


# ---- errors as OpenAI bodies -------------------------------------------------------------------


def test_overloaded_is_503_with_retry_after_rounded_up(client: TestClient):
    response = client.get("/overloaded")
    error = assert_openai_error(response, 503, "overloaded_error")
    assert error["code"] == "overloaded" and error["message"] == "the queue is full"
    assert response.headers["retry-after"] == "3"


def test_a_subsecond_retry_hint_is_at_least_one_second(client: TestClient):
    response = client.get("/not-ready")
    assert_openai_error(response, 503, "overloaded_error")
    assert response.headers["retry-after"] == "1"


def test_a_serving_error_keeps_its_status_param_and_code(client: TestClient):
    response = client.get("/missing-model")
    error = assert_openai_error(response, 404, "not_found_error")
    assert (error["param"], error["code"]) == ("model", "model_not_found")
    assert "retry-after" not in response.headers


def test_an_unexpected_exception_is_a_500_without_a_traceback(client: TestClient):
    response = client.get("/bug")
    error = assert_openai_error(response, 500, "server_error")
    assert error["code"] == "internal_error"
    assert SECRET not in response.text
    assert "Traceback" not in response.text and "RuntimeError" not in response.text
    assert ".py" not in response.text


def test_an_unknown_route_is_404_in_openai_shape(client: TestClient):
    response = client.get("/v1/nowhere")
    error = assert_openai_error(response, 404, "not_found_error")
    assert error["code"] == "route_not_found"
    assert "/v1/nowhere" in error["message"]


def test_a_wrong_method_is_405_in_openai_shape(client: TestClient):
    response = client.get("/echo")
    error = assert_openai_error(response, 405, "invalid_request_error")
    assert error["code"] == "method_not_allowed" and "GET" in error["message"]
    assert response.headers["allow"] == "POST"


@pytest.mark.parametrize("path", ["/echo", "/v1/embeddings"])
def test_invalid_json_is_400(client: TestClient, reached: list[str], path: str):
    response = client.post(
        path,
        content=b'{"model": "embedding", "input": ',
        headers={"content-type": "application/json"},
    )
    error = assert_openai_error(response, 400, "invalid_request_error")
    assert "JSON" in error["message"]
    assert reached == []


def test_a_validation_error_is_400_naming_the_field(client: TestClient, reached: list[str]):
    response = client.post("/v1/embeddings", json={"model": "embedding", "input": 5})
    error = assert_openai_error(response, 400, "invalid_request_error")
    assert error["param"] == "input"
    assert reached == []


def test_an_empty_input_keeps_its_code(client: TestClient):
    response = client.post("/v1/embeddings", json={"model": "embedding", "input": ""})
    error = assert_openai_error(response, 400, "invalid_request_error")
    assert error["code"] == "empty_input"


def test_a_valid_request_reaches_the_route(client: TestClient, reached: list[str]):
    response = client.post("/v1/embeddings", json={"model": "embedding", "input": ["a", "b"]})
    assert response.status_code == 200 and response.json() == {"texts": 2}
    assert reached == ["embeddings"]


# ---- as_serving_error --------------------------------------------------------------------------


def test_as_serving_error_passes_serving_errors_through():
    error = ModelNotFoundError("no model")
    assert as_serving_error(error) is error


def test_as_serving_error_unwraps_a_replica_error():
    class Wrapped(Exception):  # stands in for RayTaskError, which carries `cause`
        def __init__(self, cause: BaseException):
            super().__init__("wrapped")
            self.cause = cause

    inner = OverloadedError("replica busy", retry_after_s=4)
    assert as_serving_error(Wrapped(inner)) is inner


def test_as_serving_error_maps_timeouts_and_ray_failures_to_503():
    from ray.serve.exceptions import BackPressureError

    for exc in (TimeoutError(), BackPressureError(num_queued_requests=3, max_queued_requests=2)):
        mapped = as_serving_error(exc)
        assert isinstance(mapped, OverloadedError) and mapped.status == 503


def test_as_serving_error_hides_an_unexpected_exception():
    mapped = as_serving_error(ValueError(SECRET))
    assert isinstance(mapped, InternalServerError) and mapped.status == 500
    assert SECRET not in json.dumps(mapped.to_error_body())
    assert isinstance(mapped, ServingError)
