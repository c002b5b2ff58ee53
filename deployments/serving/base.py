"""What every service's request path goes through: model lookup, admission, cache and edge."""

from __future__ import annotations

from dataclasses import dataclass

from deployments.serving.admission import Admission
from deployments.serving.caching import CachedAnswers
from deployments.serving.edge_calls import EdgeCalls
from deployments.serving.models import ModelCatalogue


@dataclass(frozen=True)
class ModelService:
    catalogue: ModelCatalogue
    admission: Admission
    cached: CachedAnswers
    edge: EdgeCalls
