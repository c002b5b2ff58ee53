"""Extract the response schemas the schema tests validate against from OpenAI's spec
(`openai/openai-openapi`, `openapi.yaml`): each root schema with every component it references,
transitively, as one JSON document whose `$ref`s point inside it. Descriptions and examples are
dropped (they are prose, not constraints); nothing else is changed.

    python tests/data/openai/extract.py path/to/openapi.yaml > tests/data/openai/schemas.json
"""

from __future__ import annotations

import json
import sys
from typing import Any

import yaml

ROOTS = (
    "CreateChatCompletionResponse",
    "CreateChatCompletionStreamResponse",
    "CreateCompletionResponse",
    "CreateEmbeddingResponse",
    "CreateModerationResponse",
    "ListModelsResponse",
    "Model",
    "ErrorResponse",
)
PROSE = frozenset({"description", "example", "examples", "x-oaiMeta", "title", "x-oaiTypeLabel"})
PREFIX = "#/components/schemas/"


def stripped(node: Any, refs: set[str]) -> Any:
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            refs.add(node["$ref"].removeprefix(PREFIX))
        # `properties` maps field names, which may be called "description" or "title"
        return {
            key: (
                {name: stripped(value, refs) for name, value in node[key].items()}
                if key == "properties"
                else stripped(value, refs)
            )
            for key, value in node.items()
            if key == "properties" or key not in PROSE
        }
    if isinstance(node, list):
        return [stripped(item, refs) for item in node]
    return node


def closure(schemas: dict[str, Any], roots: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in out:
            continue
        refs: set[str] = set()
        out[name] = stripped(schemas[name], refs)
        todo.extend(sorted(refs - set(out)))
    return dict(sorted(out.items()))


def main(path: str) -> None:
    with open(path, encoding="utf-8") as file:
        spec = yaml.safe_load(file)
    document = {"components": {"schemas": closure(spec["components"]["schemas"], ROOTS)}}
    json.dump(document, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
