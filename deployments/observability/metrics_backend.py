"""Where metrics go: `ray.serve.metrics` in a replica, or memory in tests, behind one interface.

Ray exports them on its metrics endpoint with a `ray_` prefix and adds the replica's
deployment/replica/application tags. Outside a Ray worker they record nothing and raise nothing
(Ray 2.60), but they still validate tags; unit tests use `InMemoryMetricsBackend`, which applies
the same checks.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

RESERVED_TAG_KEYS = frozenset({"deployment", "replica", "application", "route"})
_METRIC_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
MetricKind = Literal["counter", "histogram", "gauge"]


class Counter(Protocol):
    def inc(self, value: float, tags: dict[str, str]) -> None: ...


class Histogram(Protocol):
    def observe(self, value: float, tags: dict[str, str]) -> None: ...


class Gauge(Protocol):
    def set(self, value: float, tags: dict[str, str]) -> None: ...


class MetricsBackend(Protocol):
    def counter(self, name: str, description: str, tag_keys: tuple[str, ...]) -> Counter: ...

    def histogram(
        self, name: str, description: str, boundaries: Sequence[float], tag_keys: tuple[str, ...]
    ) -> Histogram: ...

    def gauge(self, name: str, description: str, tag_keys: tuple[str, ...]) -> Gauge: ...


class RayServeMetricsBackend:
    """ray.serve.metrics, imported when the first metric is made (inside the replica).
    (Ray annotates tag_keys as a one-element tuple; any tuple of str is what it takes.)"""

    def counter(self, name: str, description: str, tag_keys: tuple[str, ...]) -> Counter:
        from ray.serve import metrics

        return metrics.Counter(name, description=description, tag_keys=tag_keys)  # type: ignore[arg-type]

    def histogram(
        self, name: str, description: str, boundaries: Sequence[float], tag_keys: tuple[str, ...]
    ) -> Histogram:
        from ray.serve import metrics

        return metrics.Histogram(
            name,
            description=description,
            boundaries=list(boundaries),
            tag_keys=tag_keys,  # type: ignore[arg-type]
        )

    def gauge(self, name: str, description: str, tag_keys: tuple[str, ...]) -> Gauge:
        from ray.serve import metrics

        return metrics.Gauge(name, description=description, tag_keys=tag_keys)  # type: ignore[arg-type]


@dataclass
class RecordedMetric:
    """A metric of the in-memory backend with every point recorded, checked as Ray checks."""

    kind: MetricKind
    name: str
    description: str
    tag_keys: tuple[str, ...]
    boundaries: tuple[float, ...] = ()
    points: list[tuple[float, dict[str, str]]] = field(default_factory=list)

    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        self._record("counter", value, tags)

    def observe(self, value: float, tags: dict[str, str] | None = None) -> None:
        self._record("histogram", value, tags)

    def set(self, value: float, tags: dict[str, str] | None = None) -> None:
        self._record("gauge", value, tags)

    def _record(self, kind: MetricKind, value: float, tags: dict[str, str] | None) -> None:
        if kind != self.kind:
            raise TypeError(f"{self.name} is a {self.kind}, not a {kind}")
        if not isinstance(value, int | float):
            raise TypeError(f"value must be int or float, got {type(value)}")
        if kind == "counter" and value <= 0:
            raise ValueError(f"value must be >0, got {value}")  # as ray.util.metrics.Counter
        tags = dict(tags or {})
        missing = set(self.tag_keys) - tags.keys()
        unknown = tags.keys() - set(self.tag_keys)
        if missing or unknown:
            raise ValueError(f"{self.name}: missing tags {missing or '{}'}, unknown {unknown}")
        if not all(isinstance(v, str) for v in tags.values()):
            raise TypeError(f"{self.name}: tag values must be str, got {tags}")
        self.points.append((float(value), tags))


class InMemoryMetricsBackend:
    """Keeps every recorded point, for tests and for looking at metrics without Ray."""

    def __init__(self) -> None:
        self.metrics: dict[str, RecordedMetric] = {}

    def _make(
        self,
        kind: MetricKind,
        name: str,
        description: str,
        tag_keys: tuple[str, ...],
        boundaries: Sequence[float] = (),
    ) -> RecordedMetric:
        if not _METRIC_NAME.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        if not isinstance(tag_keys, tuple) or RESERVED_TAG_KEYS & set(tag_keys):
            raise ValueError(
                f"{name}: tag keys must be a tuple without {sorted(RESERVED_TAG_KEYS)}"
            )
        if kind == "histogram" and (
            not boundaries or min(boundaries) <= 0 or list(boundaries) != sorted(boundaries)
        ):
            raise ValueError(f"{name}: boundaries must be positive and ascending")
        if name in self.metrics:
            raise ValueError(f"metric {name} is defined twice")
        metric = RecordedMetric(kind, name, description, tag_keys, tuple(boundaries))
        self.metrics[name] = metric
        return metric

    def counter(self, name: str, description: str, tag_keys: tuple[str, ...]) -> RecordedMetric:
        return self._make("counter", name, description, tag_keys)

    def histogram(
        self, name: str, description: str, boundaries: Sequence[float], tag_keys: tuple[str, ...]
    ) -> RecordedMetric:
        return self._make("histogram", name, description, tag_keys, boundaries)

    def gauge(self, name: str, description: str, tag_keys: tuple[str, ...]) -> RecordedMetric:
        return self._make("gauge", name, description, tag_keys)

    def values(self, name: str, **tags: str) -> list[float]:
        """Recorded values of `name` whose tags include `tags`."""
        return [
            value
            for value, point_tags in self.metrics[name].points
            if all(point_tags.get(key) == want for key, want in tags.items())
        ]

    def total(self, name: str, **tags: str) -> float:
        return sum(self.values(name, **tags))
