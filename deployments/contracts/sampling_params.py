"""What a generation is asked for: how to sample (`SamplingParams`), what the text must match
(`GrammarSpec`) and what else the engine takes (`GenerationOptions`: choices, tools).

Plain frozen dataclasses checked on construction and free of numpy (vLLM's `sampling_params.py`):
the router builds and validates them, and they cross the Ray call to the chat replica as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from deployments.errors import InvalidRequestError

# max_tokens when a request sets none (and the context has room for it).
DEFAULT_MAX_NEW_TOKENS = 256
MAX_STOP_STRINGS = 4
MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 100.0
GREEDY_BELOW_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0  # 1: off
    # (token id, bias) pairs: a tuple, so the params stay hashable and comparable
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    # vLLM's name: the prompt's own tokens' logprobs, with this many alternatives each (None:
    # not asked; what a legacy completion's `echo` with `logprobs` shows)
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens <= 0:
            raise InvalidRequestError(
                f"max_tokens must be at least 1, got {self.max_tokens}", param="max_tokens"
            )
        if not 0.0 <= self.temperature <= 2.0:
            raise InvalidRequestError(
                f"temperature must be between 0 and 2, got {self.temperature}", param="temperature"
            )
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}", param="top_p")
        if self.top_k < 0:
            raise InvalidRequestError(
                f"top_k must be 0 (off) or more, got {self.top_k}", param="top_k"
            )
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise InvalidRequestError(
                    f"{name} must be between -2 and 2, got {getattr(self, name)}", param=name
                )
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise InvalidRequestError(
                f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}",
                param="repetition_penalty",
            )
        if any(abs(bias) > MAX_LOGIT_BIAS for _, bias in self.logit_bias):
            raise InvalidRequestError(
                f"logit_bias values must be between -{MAX_LOGIT_BIAS:g} and {MAX_LOGIT_BIAS:g}",
                param="logit_bias",
            )
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequestError(
                f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {self.top_logprobs}",
                param="top_logprobs",
            )
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequestError(
                f"prompt_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, "
                f"got {self.prompt_logprobs}",
                param="logprobs",
            )
        if len(self.stop) > MAX_STOP_STRINGS or any(not s for s in self.stop):
            raise InvalidRequestError(
                f"stop takes up to {MAX_STOP_STRINGS} non-empty strings", param="stop"
            )

    @classmethod
    def bias_from(
        cls, logit_bias: Mapping[str, float] | Mapping[int, float] | None
    ) -> tuple[tuple[int, float], ...]:
        """OpenAI's `{"token id": bias}` map as the params' sorted pairs."""
        return tuple(sorted((int(k), float(v)) for k, v in (logit_bias or {}).items()))

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE

    @property
    def counts_tokens(self) -> bool:
        """Whether sampling depends on the tokens seen so far (a penalty is on)."""
        return (
            self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
            or self.repetition_penalty != 1.0
        )


# Compact-but-readable JSON as OpenAI's models write it: `{"a": 1, "b": [2, 3]}`. Fixed
# separators (no free whitespace) also keep a weak model from padding forever.
JSON_OPTIONS: Mapping[str, Any] = {
    "item_separator": ", ",
    "key_separator": ": ",
    "whitespace_flexible": False,
}


@dataclass(frozen=True)
class GrammarSpec:
    """What a request's output must match, before it is compiled for a model: a JSON schema
    (None: any JSON object) or a Lark grammar. Plain data, so it crosses a Ray call."""

    kind: Literal["json_schema", "lark"]
    source: Any = None
    param: str = "response_format"  # the request field an invalid grammar is blamed on
    end_text: str = ""  # Lark: the text that ends it, where it may also repeat ...
    repeat_text: str = ""  # ... this text (see GrammarCompiler.closing_rank)


@dataclass(frozen=True)
class GenerationOptions:
    """What the engine takes beyond sampling: `n` choices decoded side by side, the `tools` the
    chat template declares, the `grammar` every choice must match, and whether special tokens
    stay in the text (a tool-call parser that reads them)."""

    n: int = 1
    tools: tuple[Mapping[str, Any], ...] = ()
    grammar: GrammarSpec | None = None
    keep_special_tokens: bool = False
