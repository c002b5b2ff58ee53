"""What a model replica answers: the result plus the replica's readiness, which is how the router
tells a request that waited on a cold start from one that did not."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class StartPhases:
    """Where a replica's cold start went, in seconds."""

    process_s: float | None  # worker process start -> our __init__ (Ray, Python, imports)
    model_load_s: float  # graph, tokenizer and session
    warmup_s: float  # the first run
    init_s: float  # our whole __init__

    def as_dict(self) -> dict[str, float | None]:
        return dict(vars(self))


@dataclass(frozen=True)
class Reply(Generic[T]):
    """A model result plus when its replica became ready: a request that arrived before that
    moment waited on a cold start, which is how the router accounts for cold starts."""

    value: T
    replica_ready_at: float  # unix time
    replica_load_s: float
    phases: StartPhases | None = None
