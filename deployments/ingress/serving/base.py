"""What every service's request path goes through: model lookup, admission, cache and edge."""

from __future__ import annotations

from dataclasses import dataclass

from deployments.ingress.edge.dispatch import EdgeDispatcher
from deployments.ingress.serving.admission import Admission
from deployments.ingress.serving.caching import CachedAnswers
from deployments.ingress.serving.models import ModelCatalogue


@dataclass(frozen=True)
class ModelService:
    catalogue: ModelCatalogue
    admission: Admission
    cached: CachedAnswers
    edge: EdgeDispatcher
