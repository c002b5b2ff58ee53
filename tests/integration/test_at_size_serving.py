"""An at-size model served through Serve: the GLM-4 stand-in at full width and with the real
151,552-token vocabulary (one layer, so it builds in about a minute), exported as the fused
slot-cache graph, deployed as `glm` in the session's cluster with `serve deploy`. Streams, a
tool call, a `json_schema` answer and logprobs come back from it through the router (the
moderation gate off for it: its random text is what the gate refuses at times); the session's
own config is deployed again afterwards."""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import openai
import pytest
from conftest import USER_KEY, ServeCluster, wait_until

from deployments.contracts.manifest import ModelManifest
from deployments.export.at_size import build_large

AT_SIZE_VOCAB = 151_552
LAYERS = 1  # full width and vocabulary: the head, sampling and masks at the served width
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
SEA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "depth_m": {"type": "integer"}},
    "required": ["name", "depth_m"],
    "additionalProperties": False,
}


def _deploy_and_wait(cluster: ServeCluster, config: dict, what: str) -> None:
    before = set(cluster.replica_actors("glm"))
    cluster.deploy(config)
    # A new model directory restarts glm's replicas: done when none of the old ones is left.
    wait_until(
        lambda: (
            cluster.serve_status()["applications"]["edge"]["status"] == "RUNNING"
            and not before & set(cluster.replica_actors("glm"))
        ),
        timeout_s=600,
        what=what,
        every_s=2,
    )


@pytest.fixture(scope="module")
def at_size_glm(
    serve_cluster: ServeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("at-size")
    (model_dir,) = build_large(root, LAYERS, ["glm"])
    original = copy.deepcopy(serve_cluster.config)
    changed = copy.deepcopy(original)
    args = changed["applications"][0]["args"]
    args["models"]["glm"]["model_dir"] = str(model_dir)
    # The random-weight model's text is random, and the moderation gate (unit- and
    # integration-tested on its own) refuses some of it: these tests are about serving at size.
    gate = args["security"]["moderation_gate"]
    gate["models"] = [model for model in gate["models"] if model != "glm"]
    _deploy_and_wait(serve_cluster, changed, "glm at size to be deployed")
    try:
        yield model_dir
    finally:
        _deploy_and_wait(serve_cluster, original, "the session's glm to be deployed again")
        # Gigabytes (checkpoint, export, prepacked weights): never left for the session's end.
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def client(serve_cluster: ServeCluster, at_size_glm: Path) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{serve_cluster.base_url}/v1", api_key=USER_KEY, max_retries=0)


def test_the_served_model_is_the_at_size_slot_cache_export(at_size_glm: Path) -> None:
    manifest = ModelManifest.load(at_size_glm)
    assert manifest.vocab_size == AT_SIZE_VOCAB
    assert manifest.llm is not None and manifest.llm.kv_cache.layout == "slots"
    assert json.loads((at_size_glm / "config.json").read_text())["hidden_size"] == 896


def test_a_stream_of_the_at_size_model(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="glm",
        messages=ASK,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert usage is not None and 0 < usage.completion_tokens <= 12
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish and finish[-1] in ("stop", "length", "content_filter")
    assert text or finish[-1] != "length"


def test_a_tool_call_of_the_at_size_model(client: openai.OpenAI) -> None:
    done = client.chat.completions.create(
        model="glm", messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=64
    )
    message = done.choices[0].message
    assert done.choices[0].finish_reason == "tool_calls" and message.tool_calls
    call = message.tool_calls[0]
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_a_json_schema_answer_of_the_at_size_model(client: openai.OpenAI) -> None:
    done = client.chat.completions.create(
        model="glm",
        messages=[{"role": "user", "content": "Describe the sea."}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "sea", "schema": SEA, "strict": True},
        },
        max_tokens=512,  # the grammar closes the object; a random model's strings run long
        temperature=0,
    )
    choice = done.choices[0]
    assert choice.finish_reason == "stop", choice
    jsonschema.validate(json.loads(choice.message.content or ""), SEA)


def test_logprobs_of_the_at_size_model_are_ranked(client: openai.OpenAI) -> None:
    done = client.chat.completions.create(
        model="glm", messages=ASK, max_tokens=6, logprobs=True, top_logprobs=3, temperature=0
    )
    tokens = done.choices[0].logprobs.content
    assert tokens and len(tokens) == done.usage.completion_tokens
    for token in tokens:
        ranked = [t.logprob for t in token.top_logprobs]
        assert len(ranked) == 3 and ranked == sorted(ranked, reverse=True)
        # Greedy: the chosen token is the most likely one.
        assert token.logprob == pytest.approx(ranked[0], abs=1e-4)
