"""What a service returns: the value the route shapes into a body, and the headers it carries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from deployments.ingress.edge.trace import EdgeTrace
from deployments.ingress.security import Reservation

T = TypeVar("T")


@dataclass(frozen=True)
class Answer(Generic[T]):
    value: T
    headers: dict[str, str]  # x-edge-* (where it was served) and x-ratelimit-* (the key's budget)

    @classmethod
    def of(cls, value: T, trace: EdgeTrace, quota: Reservation) -> Answer[T]:
        return cls(value, {**trace.headers(), **quota.headers})

    def with_headers(self, headers: dict[str, str]) -> Answer[T]:
        """This answer with `headers` added (the same answer when there are none)."""
        return Answer(self.value, {**self.headers, **headers}) if headers else self
