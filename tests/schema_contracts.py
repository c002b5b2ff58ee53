"""The vendors' published contracts (tests/data, provenance in tests/data/README.md) as JSON Schema
validators: OpenAI's response schemas, Cloudflare's v4 envelope and catalogue records. Shared by
the unit schema suite and the live checks."""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

DATA = Path(__file__).resolve().parent / "data"
OPENAI_BASE = "urn:openai-openapi"
CLOUDFLARE_BASE = "urn:cloudflare-common"
# Each name a model answers to on the Workers AI paths, and the catalogue record whose shape it
# answers in: the chat aliases as their records (OpenAI's chat.completion), the native chat names
# as a classic text-generation record, the encoders as the records of their task.
CATALOGUE_RECORD_OF = {
    "@cf/zai-org/glm-4.7-flash": "glm-4.7-flash",
    "@cf/moonshotai/kimi-k2.6": "kimi-k2.6",
    "glm": "llama-3.1-8b-instruct-fp8",
    "kimi": "llama-3.1-8b-instruct-fp8",
    "@cf/sentence-transformers/all-minilm-l6-v2": "bge-small-en-v1.5",
    "embedding": "bge-small-en-v1.5",
    "@cf/ray-edge-ai/profanity-check": "distilbert-sst-2-int8",
    "moderation": "distilbert-sst-2-int8",
}


def with_nullable(node: Any) -> Any:
    """OpenAPI 3.0's `nullable: true` (left in OpenAI's 3.1 document, e.g. the stream chunk's
    `finish_reason`) as JSON Schema says it: null is allowed too."""
    if isinstance(node, list):
        return [with_nullable(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: with_nullable(value) for key, value in node.items() if key != "nullable"}
    if node.get("nullable") is True:
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
        if "$ref" in out:
            return {"anyOf": [{"$ref": out.pop("$ref")}, {"type": "null"}], **out}
        if isinstance(out.get("type"), str):
            out["type"] = [out["type"], "null"]
    return out


@cache
def _openai_registry() -> Registry:
    document = with_nullable(json.loads((DATA / "openai" / "schemas.json").read_text()))
    return Registry().with_resource(OPENAI_BASE, Resource(document, DRAFT202012))


def openai_validator(schema_name: str) -> jsonschema.Draft202012Validator:
    """A validator of OpenAI's component schema `schema_name` ("CreateChatCompletionResponse")."""
    ref = {"$ref": f"{OPENAI_BASE}#/components/schemas/{schema_name}"}
    return jsonschema.Draft202012Validator(ref, registry=_openai_registry())


@cache
def _cloudflare_registry() -> Registry:
    document = with_nullable(yaml.safe_load((DATA / "cloudflare" / "common.yaml").read_text()))
    return Registry().with_resource(CLOUDFLARE_BASE, Resource(document, DRAFT202012))


def envelope_validator(schema_name: str) -> jsonschema.Draft202012Validator:
    """Cloudflare's v4 envelope: `api-response-common`, `api-response-common-failure` or
    `api-response-collection`."""
    ref = {"$ref": f"{CLOUDFLARE_BASE}#/components/schemas/{schema_name}"}
    return jsonschema.Draft202012Validator(ref, registry=_cloudflare_registry())


def catalogue_record(name: str) -> dict[str, Any]:
    path = DATA / "cloudflare" / "workers-ai-models" / f"{name}.json"
    record: dict[str, Any] = json.loads(path.read_text())
    return record


def catalogue_output_validator(model_name: str) -> jsonschema.Draft202012Validator:
    """The `result` schema (the JSON answer) of the catalogue record `model_name` follows."""
    output = catalogue_record(CATALOGUE_RECORD_OF[model_name])["schema"]["output"]
    return jsonschema.Draft202012Validator(output)


def _type_of(ts_type: str) -> dict[str, Any]:
    return {"string": {"type": "string"}, "number": {"type": "number"}}[ts_type]


@cache
def models_search_object_schema() -> dict[str, Any]:
    """`AiModelsSearchObject` (a TypeScript type, cloudflare/ai-models-search-object.d.ts) as
    JSON Schema: each `name: type;` a required field; `{...}` an object, `{...}[]` an array of
    them. Read by a parser of exactly the shapes that file uses."""
    lines = (DATA / "cloudflare" / "ai-models-search-object.d.ts").read_text().splitlines()
    stack: list[dict[str, Any]] = [{"type": "object", "properties": {}, "required": []}]
    names: list[str] = []
    for line in (line.strip() for line in lines[1:-1]):
        if line.endswith("{"):
            names.append(line.split(":")[0])
            stack.append({"type": "object", "properties": {}, "required": []})
        elif line.startswith("}"):
            done, name = stack.pop(), names.pop()
            node = {"type": "array", "items": done} if line.startswith("}[]") else done
            stack[-1]["properties"][name] = node
            stack[-1]["required"].append(name)
        else:
            name, ts_type = (part.strip() for part in line.rstrip(";").split(":"))
            if ts_type.endswith("[]"):
                node = {"type": "array", "items": _type_of(ts_type[:-2])}
            else:
                node = _type_of(ts_type)
            stack[-1]["properties"][name] = node
            stack[-1]["required"].append(name)
    (schema,) = stack
    return schema


def problems(validator: jsonschema.Draft202012Validator, instance: Any) -> list[str]:
    """Every way `instance` breaks the schema, one line each (empty: valid)."""
    return [
        f"{'/'.join(map(str, error.absolute_path)) or '<root>'}: {error.message}"
        for error in sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))
    ]


def assert_valid(validator: jsonschema.Draft202012Validator, instance: Any, what: str) -> None:
    found = problems(validator, instance)
    assert not found, f"{what} breaks the published schema:\n" + "\n".join(found)


def sse_events(text: str) -> list[Mapping[str, Any] | str]:
    """A server-sent event stream's `data:` payloads, JSON-decoded except `[DONE]`."""
    events: list[Mapping[str, Any] | str] = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events
