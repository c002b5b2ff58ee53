"""`POST /v1/moderations`: text inputs in, one verdict per input out. Categories are whatever the
model scores (ours: `harassment` and `profanity`), not OpenAI's fixed thirteen."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, field_validator

from deployments.protocol.common import (
    OpenAIRequest,
    ResponseModel,
    as_text_list,
    check_text_inputs,
)

DEFAULT_MODERATION_MODEL = "moderation"
MAX_MODERATION_INPUTS = 2048

InputType = Literal["text"]


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
        """A text-only verdict; `flagged` if any category is. Categories come out sorted so a
        response's bytes do not depend on the order the model listed them in."""
        if set(scores) != set(flags):
            raise ValueError(f"scored {sorted(scores)} but flagged {sorted(flags)}")
        names = sorted(scores)
        return cls(
            flagged=any(flags[name] for name in names),
            categories={name: bool(flags[name]) for name in names},
            category_scores={name: float(scores[name]) for name in names},
            category_applied_input_types={name: ["text"] for name in names},
        )


class ModerationCreateResponse(ResponseModel):
    id: str
    model: str
    results: list[Moderation]
