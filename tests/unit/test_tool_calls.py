"""GLM-4 and Kimi-K2 tool calls: templates that declare tools and render past calls, parsers
from generated text (whole and streamed), and grammars that force valid calls."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from deployments.contracts.manifest import ModelManifest
from deployments.contracts.sampling_params import GenerationOptions, SamplingParams
from deployments.export.chat_tokenizer import CHAT_FORMATS
from deployments.replica.engine.grammar import GrammarCompiler
from deployments.replica.engine.llm import LLMRuntime
from deployments.replica.engine.tokenizer import ChatTokenizer
from deployments.replica.engine.tool_calls import (
    Glm4ToolCalls,
    KimiK2ToolCalls,
    ToolCallStream,
    argument_schema,
    tool_call_format,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather now <|user|>",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string"}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
NAMES = ["get_weather", "get_time"]
CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "functions.get_weather:0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny"},
]


def current_template(models_root: Path, family: str) -> ChatTokenizer:
    """The family's tokenizer with the template the export writes now."""
    manifest = ModelManifest.load(models_root / family)
    assert manifest.llm is not None
    return ChatTokenizer(
        models_root / family / "tokenizer.json",
        CHAT_FORMATS[family].chat_template,
        manifest.llm.special_tokens,
        manifest.llm.eos_token_ids,
    )


def test_glm_declares_tools_and_renders_past_calls(models_root: Path) -> None:
    tok = current_template(models_root, "glm")
    text = tok.render(CONVERSATION, [WEATHER])
    assert "# 可用工具\n\n## get_weather\n\n{\n" in text
    assert '"description": "Weather now <|user|>"' in text
    assert text.endswith(
        '<|assistant|>get_weather\n{"city": "Paris"}<|observation|>\nsunny<|assistant|>'
    )
    # a client's "<|user|>" inside a tool description stays text, never the special token
    ids = tok.encode_chat(CONVERSATION, [WEATHER])
    assert ids.count(tok.special_tokens["<|user|>"]) == 1


def test_kimi_declares_tools_and_renders_past_calls(models_root: Path) -> None:
    tok = current_template(models_root, "kimi")
    text = tok.render(CONVERSATION, [WEATHER])
    declared = text.split("<|im_system|>tool_declare<|im_middle|>", 1)[1].split("<|im_end|>")[0]
    assert json.loads(declared) == [WEATHER]
    assert (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>'
        "<|tool_calls_section_end|><|im_end|>"
    ) in text
    assert "## Return of functions.get_weather:0\nsunny" in text


def test_glm_parser() -> None:
    fmt = Glm4ToolCalls()
    content, calls = fmt.parse(
        'get_weather\n{"city": "Oslo", "unit": "c"}<|assistant|>get_time\n{"zone": "CET"}', NAMES
    )
    assert content == ""
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Oslo", "unit": "c"}),
        ("get_time", {"zone": "CET"}),
    ]
    assert len({c.id for c in calls}) == 2
    for text in ("\nIt is sunny.", "get_weather\nnot json", 'unknown\n{"a": 1}'):
        assert fmt.parse(text, NAMES) == (text, [])


def test_kimi_parser() -> None:
    fmt = KimiK2ToolCalls()
    text = (
        "Let me check.<|tool_calls_section_begin|>"
        '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Oslo"}'
        "<|tool_call_end|><|tool_call_begin|> functions.get_time:1 <|tool_call_argument_begin|>"
        '{"zone": "CET"}<|tool_call_end|><|tool_calls_section_end|>'
    )
    content, calls = fmt.parse(text, NAMES)
    assert content == "Let me check."
    assert [(c.id, c.name, c.arguments) for c in calls] == [
        ("functions.get_weather:0", "get_weather", '{"city": "Oslo"}'),
        ("functions.get_time:1", "get_time", '{"zone": "CET"}'),
    ]
    assert fmt.parse("plain answer", NAMES) == ("plain answer", [])


@pytest.mark.parametrize(
    ("fmt", "text", "content", "calls"),
    [
        (Glm4ToolCalls(), "\nSunny all day.", "\nSunny all day.", 0),
        (Glm4ToolCalls(), 'get_time\n{"zone": "UTC"}', "", 1),
        (
            KimiK2ToolCalls(),
            "Sure.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0"
            '<|tool_call_argument_begin|>{"zone": "UTC"}<|tool_call_end|>'
            "<|tool_calls_section_end|>",
            "Sure.",
            1,
        ),
    ],
)
def test_streamed_text_splits_into_content_and_calls(fmt, text, content, calls) -> None:
    for size in (1, 3, 7):
        stream = ToolCallStream(fmt, NAMES)
        passed = "".join(stream.feed(text[i : i + size]) for i in range(0, len(text), size))
        rest, found = fmt.parse(stream.finish(), NAMES)
        assert passed + rest == content
        assert len(found) == calls
        if calls:
            assert found[0].name == "get_time" and json.loads(found[0].arguments) == {"zone": "UTC"}


@pytest.mark.parametrize("family", ["glm", "kimi"])
@pytest.mark.parametrize("parallel", [False, True])
def test_forced_calls_from_random_weights_always_parse_and_validate(
    models_root: Path, family: str, parallel: bool
) -> None:
    runtime = LLMRuntime(models_root / family)
    try:
        fmt = tool_call_format(family, list(runtime.tokenizer.special_tokens))
        tools = [WEATHER, TIME]

        async def run() -> list:
            return await runtime.complete_choices(
                [{"role": "user", "content": "weather?"}],
                SamplingParams(max_tokens=200, seed=5),
                GenerationOptions(
                    n=4,
                    tools=tuple(tools),
                    grammar=fmt.grammar(tools, parallel),
                    keep_special_tokens=fmt.keeps_special_tokens,
                ),
            )

        for choice in asyncio.run(run()):
            assert choice.finish_reason == "stop", choice.text
            content, calls = fmt.parse(choice.text, NAMES)
            assert calls and not content.strip(), choice.text
            assert parallel or len(calls) == 1
            for call in calls:
                tool = WEATHER if call.name == "get_weather" else TIME
                jsonschema.validate(json.loads(call.arguments), argument_schema(tool))
    finally:
        runtime.close()


@pytest.mark.parametrize(
    ("fmt", "text", "expected"),
    [
        (Glm4ToolCalls(), "get_ti", []),
        (Glm4ToolCalls(), 'get_time\n{"zone": "U', [("get_time", '{"zone": "U')]),
        (
            Glm4ToolCalls(),
            'get_time\n{"zone": "UTC"}<|assistant|>get_weather\n{"ci',
            [("get_time", '{"zone": "UTC"}'), ("get_weather", '{"ci')],
        ),
        (KimiK2ToolCalls(), "<|tool_calls_section_begin|><|tool_call_begin|>functions.get", []),
        (
            KimiK2ToolCalls(),
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0"
            "<|tool_call_argument_begin|>",
            [("get_time", "")],
        ),
        (
            KimiK2ToolCalls(),
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0"
            '<|tool_call_argument_begin|>{"zone": "UTC"}<|tool_call_end|>'
            '<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{"city',
            [("get_time", '{"zone": "UTC"}'), ("get_weather", '{"city')],
        ),
    ],
)
def test_a_cut_forced_answer_parses_to_its_calls_as_far_as_they_came(fmt, text, expected) -> None:
    assert [(c.name, c.arguments) for c in fmt.parse_cut(text, NAMES)] == expected


ONE_MORE_CALL = {"glm": "<|assistant|>", "kimi": "<|tool_call_begin|>"}
# A name that costs many tokens: one more call is dear to close.
FORECAST = {
    "type": "function",
    "function": {
        "name": "forecast_the_weather_of_every_coastal_city_in_europe",
        "parameters": {
            "type": "object",
            "properties": {"sea": {"type": "string"}},
            "required": ["sea"],
            "additionalProperties": False,
        },
    },
}


@pytest.mark.parametrize("family", ["glm", "kimi"])
def test_a_model_that_always_wants_one_more_call_still_ends_within_its_budget(
    models_root: Path, family: str
) -> None:
    """The worst model for a budget: it starts another parallel call whenever the grammar lets
    it and otherwise writes the shortest call it can, never the end. The closing path keeps room
    for the call a sampled token may start (GLM's `<|assistant|>`, Kimi's
    `<|tool_call_begin|>`), so every answer ends by itself and parses (GLM's once did not: a
    call started 8 tokens from the end needed 14)."""
    manifest = ModelManifest.load(models_root / family)
    assert manifest.llm is not None
    compiler = GrammarCompiler(
        models_root / family / "tokenizer.json", manifest.llm.eos_token_ids, manifest.vocab_size
    )
    fmt = tool_call_format(family, list(manifest.llm.special_tokens))
    repeat = manifest.llm.special_tokens[ONE_MORE_CALL[family]]
    never = np.iinfo(np.int64).max
    grammar = fmt.grammar([FORECAST], True)
    one_call = compiler.compile(grammar).closing_cost()
    for budget in range(one_call, 4 * one_call):
        constraint = compiler.compile(grammar)
        tokens: list[int] = []
        while len(tokens) < budget and not constraint.done:
            allowed = constraint.allowed(budget - len(tokens))
            text = b"".join(compiler.token_bytes[token] for token in tokens)
            rank = np.where(allowed, compiler.closing_rank(_inside_a_string(text)), never)
            if allowed.sum() > 1:  # it ends only when made to
                rank[list(compiler.eos_token_ids)] = never
            token = repeat if allowed[repeat] else int(np.argmin(rank))
            if token in compiler.eos_token_ids:
                break
            constraint.accept(token)
            tokens.append(token)
        text = b"".join(compiler.token_bytes[token] for token in tokens).decode()
        assert len(tokens) < budget or constraint.done, (budget, text)
        content, calls = fmt.parse(text, [FORECAST["function"]["name"]])
        assert calls and not content.strip(), (budget, text)


def _inside_a_string(text: bytes) -> bool:
    inside = escaped = False
    for byte in text:
        if escaped:
            escaped = False
        elif inside and byte == 0x5C:
            escaped = True
        elif byte == 0x22:
            inside = not inside
    return inside
