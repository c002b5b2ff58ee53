"""`POST /v1/moderations`: text inputs in, one verdict per input out. Every category of OpenAI's
schema is present (the SDK's types require all thirteen); those the model does not judge are
`false` / `0.0` with no applied input types; the model's own extras (ours: `profanity`) follow."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, field_validator

from deployments.ingress.protocol.common import (
    OpenAIRequest,
    ResponseModel,
    as_text_list,
    check_text_inputs,
)

DEFAULT_MODERATION_MODEL = "moderation"
MAX_MODERATION_INPUTS = 2048

InputType = Literal["text"]

# OpenAI's moderation categories, as `openai.types.Moderation` names them.
OPENAI_CATEGORIES = (
    "harassment",
    "harassment/threatening",
    "hate",
    "hate/threatening",
    "illicit",
    "illicit/violent",
    "self-harm",
    "self-harm/instructions",
    "self-harm/intent",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
)


class ModerationRequest(OpenAIRequest):
    input: str | list[str] = Field(description="One text or a list of texts; text only.")
    model: str = Field(default=DEFAULT_MODERATION_MODEL, min_length=1)

    @field_validator("input", mode="before")
    @classmethod
    def _check_input(cls, value: Any) -> Any:
        return check_text_inputs(value, max_items=MAX_MODERATION_INPUTS)

    @property
    def texts(self) -> list[str]:
        return as_text_list(self.input)


class Moderation(ResponseModel):
    flagged: bool
    categories: dict[str, bool]
    category_scores: dict[str, float]
    category_applied_input_types: dict[str, list[InputType]] | None = None

    @classmethod
    def from_scores(cls, scores: Mapping[str, float], flags: Mapping[str, bool]) -> Moderation:
        """A text-only verdict; `flagged` if any judged category is. OpenAI's categories the
        model does not judge are false / 0.0 with no input types. Categories come out sorted so
        a response's bytes do not depend on the order the model listed them in."""
        if set(scores) != set(flags):
            raise ValueError(f"scored {sorted(scores)} but flagged {sorted(flags)}")
        names = sorted(set(scores) | set(OPENAI_CATEGORIES))
        return cls(
            flagged=any(flags.values()),
            categories={name: bool(flags.get(name, False)) for name in names},
            category_scores={name: float(scores.get(name, 0.0)) for name in names},
            category_applied_input_types={
                name: ["text"] if name in scores else [] for name in names
            },
        )


class ModerationCreateResponse(ResponseModel):
    id: str
    model: str
    results: list[Moderation]
