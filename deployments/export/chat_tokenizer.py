"""The GLM-4 and Kimi-K2 chat formats, and the small byte-level BPE tokenizers built for them
locally from the shipped corpus, deterministically (same tokenizer.json bytes on every build)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

CORPUS_DIR = Path(__file__).resolve().parent / "corpus"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"

# Both templates render content given as a string or as OpenAI text parts (joined with nothing,
# as Kimi's own template does); other part types are refused before rendering by the runtime.
_TEXT_MACRO = (
    "{%- macro text(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- else -%}{%- for part in content if part['type'] == 'text' -%}{{ part['text'] }}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
)

# GLM-4: the message layout of THUDM/glm-4-9b-chat-hf and GLM-4-0414's `chat_template`: the
# `[gMASK]<sop>` prefix, the tool declarations (`# 可用工具`, one `## name` and its JSON per
# function), every system message, then `<|role|>\n content` per turn and a bare `<|assistant|>`
# as the generation prompt. A past tool call is `<|assistant|>{name}\n{arguments}` (the model
# writes calls the same way); a tool result is an `<|observation|>` turn. Reproduced from those
# templates as mirrored in public repositories; left out: `metadata` turns and `</think>`.
GLM4_CHAT_TEMPLATE = (
    "[gMASK]<sop>" + _TEXT_MACRO + "{%- if tools -%}<|system|>\n# 可用工具"
    "{%- for tool in tools -%}"
    "{%- set function = tool['function'] if tool.get('function') else tool -%}"
    "{{ '\\n\\n## ' }}{{ function['name'] }}{{ '\\n\\n' }}"
    "{{ function | tojson(indent=4) }}{{ '\\n' }}"
    "在调用上述函数时，请使用 Json 格式表示调用的参数。"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- for message in messages if message['role'] == 'system' -%}"
    "<|system|>\n{{ text(message['content']) }}"
    "{%- endfor -%}"
    "{%- for message in messages if message['role'] != 'system' -%}"
    "{%- set role = message['role'] -%}"
    "{%- if role == 'user' -%}<|user|>\n{{ text(message['content']) }}"
    "{%- elif role == 'assistant' and message.get('tool_calls') -%}"
    "{%- if message['content'] -%}<|assistant|>\n{{ text(message['content']) }}{%- endif -%}"
    "{%- for call in message['tool_calls'] -%}"
    "<|assistant|>{{ call['function']['name'] }}\n{{ call['function']['arguments'] }}"
    "{%- endfor -%}"
    "{%- elif role == 'assistant' -%}<|assistant|>\n{{ text(message['content']) }}"
    "{%- elif role == 'observation' or role == 'tool' -%}<|observation|>\n"
    "{{ text(message['content']) }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)

# Kimi-K2: moonshotai/Kimi-K2-Instruct `chat_template.jinja` (as mirrored in llama.cpp's tests):
# the `tool_declare` system turn (the tools as compact JSON) when tools are given, then
# `<|im_{role}|>{name or role}<|im_middle|>content<|im_end|>`, an assistant's past calls in a
# `<|tool_calls_section_begin|>` section (`<|tool_call_begin|>{id}<|tool_call_argument_begin|>
# {arguments}<|tool_call_end|>` each), tool results as a system turn named `tool`, and Kimi's
# default system prompt when the conversation does not start with one. Left out: media parts.
# Deviation: a tool result is `## Return of {id}\n{content}` (the original's indentation leaks 4
# spaces after the newline).
KIMI_K2_DEFAULT_SYSTEM = "You are Kimi, an AI assistant created by Moonshot AI."
KIMI_K2_CHAT_TEMPLATE = (
    _TEXT_MACRO + "{%- if tools -%}"
    "<|im_system|>tool_declare<|im_middle|>{{ tools | tojson(separators=(',', ':')) }}<|im_end|>"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if loop.first and messages[0]['role'] != 'system' -%}"
    "<|im_system|>system<|im_middle|>" + KIMI_K2_DEFAULT_SYSTEM + "<|im_end|>"
    "{%- endif -%}"
    "{%- set role_name = message.get('name') or message['role'] -%}"
    "{%- if message['role'] == 'user' -%}<|im_user|>{{ role_name }}<|im_middle|>"
    "{%- elif message['role'] == 'assistant' -%}<|im_assistant|>{{ role_name }}<|im_middle|>"
    "{%- else -%}<|im_system|>{{ role_name }}<|im_middle|>"
    "{%- endif -%}"
    "{%- if message['role'] == 'tool' -%}"
    "## Return of {{ message.get('tool_call_id', '') }}\n{{ text(message['content']) }}"
    "{%- else -%}{{ text(message['content']) }}"
    "{%- endif -%}"
    "{%- if message['role'] == 'assistant' and message.get('tool_calls') -%}"
    "<|tool_calls_section_begin|>"
    "{%- for call in message['tool_calls'] -%}"
    "<|tool_call_begin|>{{ call['id'] }}<|tool_call_argument_begin|>"
    "{{ call['function']['arguments'] }}<|tool_call_end|>"
    "{%- endfor -%}"
    "<|tool_calls_section_end|>"
    "{%- endif -%}"
    "<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)


@dataclass(frozen=True)
class ChatFormat:
    """One chat family's special tokens (in id order), template and stop tokens."""

    family: str
    special_tokens: tuple[str, ...]
    chat_template: str
    eos_tokens: tuple[str, ...]
    bos_token: str | None
    pad_token: str

    def __post_init__(self) -> None:
        declared = set(self.special_tokens)
        missing = [t for t in (*self.eos_tokens, self.bos_token, self.pad_token) if t is not None]
        unknown = [t for t in missing if t not in declared]
        if unknown:
            raise ValueError(f"{self.family}: {unknown} are not among its special tokens")


# Specials are listed in the order of the real vocabularies' ids (GLM-4: 151329.., Kimi: 163584..),
# so the relative order survives even though our ids start at 0.
CHAT_FORMATS: Mapping[str, ChatFormat] = MappingProxyType(
    {
        "glm": ChatFormat(
            family="glm",
            special_tokens=(
                "<|endoftext|>",
                "[MASK]",
                "[gMASK]",
                "[sMASK]",
                "<sop>",
                "<eop>",
                "<|system|>",
                "<|user|>",
                "<|assistant|>",
                "<|observation|>",
                "<|begin_of_image|>",
                "<|end_of_image|>",
                "<|begin_of_video|>",
                "<|end_of_video|>",
            ),
            chat_template=GLM4_CHAT_TEMPLATE,
            # GLM-4's generation_config stops on these three: end of text, or the model starting
            # the next user or observation turn itself.
            eos_tokens=("<|endoftext|>", "<|user|>", "<|observation|>"),
            bos_token=None,
            pad_token="<|endoftext|>",
        ),
        "kimi": ChatFormat(
            family="kimi",
            special_tokens=(
                "[BOS]",
                "[EOS]",
                "<|im_end|>",
                "<|im_user|>",
                "<|im_assistant|>",
                "<|im_system|>",
                # Kimi's tool calls are written in these (tool_calls.py): one token each, as in
                # the real vocabulary, so a forced call's markup costs 5 tokens, not 60.
                "<|tool_calls_section_begin|>",
                "<|tool_calls_section_end|>",
                "<|tool_call_begin|>",
                "<|tool_call_argument_begin|>",
                "<|tool_call_end|>",
                "<|im_middle|>",
                "[PAD]",
            ),
            chat_template=KIMI_K2_CHAT_TEMPLATE,
            eos_tokens=("<|im_end|>", "[EOS]"),
            bos_token="[BOS]",
            pad_token="[PAD]",
        ),
    }
)


def corpus_lines(corpus_dir: Path = CORPUS_DIR) -> Iterator[str]:
    """Every line of the shipped corpus, newline kept, files in sorted order."""
    files = sorted(corpus_dir.glob("*.txt"))
    if not files:
        raise FileNotFoundError(f"no *.txt training corpus in {corpus_dir}")
    for path in files:
        with path.open(encoding="utf-8") as f:
            yield from f


def build_tokenizer(fmt: ChatFormat, vocab_size: int = 4096) -> Tokenizer:
    """Train a byte-level BPE on the shipped corpus; `fmt.special_tokens` take ids 0..n-1.

    Byte-level means any UTF-8 text encodes (no unknown token) and decodes back unchanged; there is
    no normalizer, so decode(encode(s)) == s exactly.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[_special(t) for t in fmt.special_tokens],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_lines(), trainer=trainer)
    for expected_id, token in enumerate(fmt.special_tokens):
        if tokenizer.token_to_id(token) != expected_id:
            raise RuntimeError(
                f"{fmt.family}: special token {token!r} did not get id {expected_id}"
            )
    return tokenizer


def _special(token: str) -> AddedToken:
    # Matched verbatim: no whitespace stripping, never normalized, skipped by decode(skip_special).
    return AddedToken(
        token, single_word=False, lstrip=False, rstrip=False, normalized=False, special=True
    )


def save_tokenizer(tok: Tokenizer, fmt: ChatFormat, out_dir: str | Path) -> dict[str, Any]:
    """Write tokenizer.json + an HF-style tokenizer_config.json; return what LLMSpec needs."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    special_ids = {t: _id_of(tok, t) for t in fmt.special_tokens}
    tok.save(str(out_dir / TOKENIZER_FILE), pretty=True)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": {
            str(i): {
                "content": t,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for t, i in special_ids.items()
        },
        "additional_special_tokens": list(fmt.special_tokens),
        "bos_token": fmt.bos_token,
        "eos_token": fmt.eos_tokens[0],
        "pad_token": fmt.pad_token,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": fmt.chat_template,
    }
    text = json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False)
    (out_dir / TOKENIZER_CONFIG_FILE).write_text(text + "\n", encoding="utf-8")
    return {
        "eos_token_ids": [special_ids[t] for t in fmt.eos_tokens],
        "bos_token_id": special_ids[fmt.bos_token] if fmt.bos_token else None,
        "pad_token_id": special_ids[fmt.pad_token],
        "special_tokens": special_ids,
        "chat_template": fmt.chat_template,
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
    }


def _id_of(tok: Tokenizer, token: str) -> int:
    token_id = tok.token_to_id(token)
    if token_id is None:
        raise ValueError(f"special token {token!r} is not in the tokenizer")
    return token_id
