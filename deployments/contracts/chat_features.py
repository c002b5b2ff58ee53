"""What a chat request asks beyond sampling (n choices, tools, a response format), as it crosses
the Ray call to a chat replica; the replica's engine turns it into a grammar and parses tool calls
out of the text (deployments.replica.engine.chat_features)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ChatFeatures:
    """Plain data, so it crosses a Ray call. `tool_choice`: none, auto, required, or the name
    of the one function to call; `response_format`: OpenAI's object."""

    n: int = 1
    tools: tuple[Mapping[str, Any], ...] = ()
    tool_choice: str = "auto"
    parallel_tool_calls: bool = True
    response_format: Mapping[str, Any] | None = None
    raw: bool = False  # the last message's content is the whole prompt: no chat template

    @property
    def tool_names(self) -> list[str]:
        return [str(function_of(t).get("name")) for t in self.tools]

    @property
    def parses_tool_calls(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def forces_tool_call(self) -> bool:
        """`tool_choice` required or a function's name: the grammar writes calls only."""
        return bool(self.tools) and self.tool_choice not in ("none", "auto")


def function_of(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    """The `function` object of an OpenAI tool (or the tool itself, Workers AI's flat style)."""
    function = tool.get("function")
    return function if isinstance(function, Mapping) else tool
