"""Hypothesis on the protocol parsers and header parsing: any input is either accepted or turned
into one clean 400 - never another exception."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from deployments.errors import InvalidRequestError
from deployments.ingress.protocol import (
    WORKERS_INPUT_BY_TASK,
    ChatCompletionRequest,
    EmbeddingRequest,
    ModerationRequest,
    request_error_from_validation,
)
from edge_sim.config import EdgeConfig
from edge_sim.geo import BadHeaderError, ClientLocator, CountryCentroids
from edge_sim.network import EdgeNetwork

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "x"]), "content": JSON}
)
CHAT_LIKE = st.fixed_dictionaries(
    {"model": JSON, "messages": st.lists(MESSAGE, max_size=3) | JSON},
    optional={
        "max_tokens": JSON,
        "temperature": JSON,
        "top_p": JSON,
        "stop": JSON,
        "n": JSON,
        "stream": JSON,
        "stream_options": JSON,
        "seed": JSON,
        "logit_bias": JSON,
    },
)
TEXTS_LIKE = st.fixed_dictionaries(
    {"model": JSON, "input": JSON}, optional={"encoding_format": JSON, "dimensions": JSON}
)
REQUEST_TYPES = [ChatCompletionRequest, EmbeddingRequest, ModerationRequest]


def parses_or_400(model: type, body: object) -> None:
    try:
        model.model_validate(body)
    except ValidationError as exc:
        error = request_error_from_validation(exc.errors())
        assert isinstance(error, InvalidRequestError) and error.status == 400
        assert error.message


@settings(max_examples=300, deadline=None)
@given(st.one_of(CHAT_LIKE, JSON))
def test_chat_requests_parse_or_give_a_400(body):
    parses_or_400(ChatCompletionRequest, body)


@settings(max_examples=300, deadline=None)
@given(st.one_of(TEXTS_LIKE, JSON), st.sampled_from([EmbeddingRequest, ModerationRequest]))
def test_text_requests_parse_or_give_a_400(body, model):
    parses_or_400(model, body)


@settings(max_examples=200, deadline=None)
@given(JSON, st.sampled_from(sorted(WORKERS_INPUT_BY_TASK)))
def test_workers_inputs_parse_or_give_a_400(body, task):
    parses_or_400(WORKERS_INPUT_BY_TASK[task], body)


LOCATOR = ClientLocator(
    EdgeConfig().default_location.location(), CountryCentroids({"FR": (46.0, 2.0)}), None
)


@settings(max_examples=400, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["x-client-geo", "cf-ipcountry", "other"]), st.text(max_size=40), max_size=3
    )
)
def test_location_headers_locate_or_name_the_bad_header(headers):
    try:
        location = LOCATOR.locate(headers, None)
    except BadHeaderError as exc:
        assert exc.header in headers
        return
    assert -90 <= location.lat <= 90 and -180 <= location.lon <= 180


def test_network_route_handles_the_default_topology():
    network = EdgeNetwork(EdgeConfig())
    assert network.route("glm", {"x-client-geo": "0,0"}).candidates
