"""A model replica's own count of the calls it ran, from Ray's Prometheus endpoint: every call a
chat replica finishes is one observation of `edge_model_batch_size` (docs/observability.md)."""

from __future__ import annotations

import httpx

# A histogram's `_count` sample: one per finished model call, per replica (Ray adds its tags).
MODEL_CALLS_METRIC = "ray_edge_model_batch_size_count"


def metric_total(text: str, name: str, labels: dict[str, str]) -> float | None:
    """The sum of `name`'s samples carrying every label of `labels` (every replica's); None when
    the endpoint shows no such sample yet."""
    wanted = [f'{label}="{value}"' for label, value in labels.items()]
    samples = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and all(label in line for label in wanted)
    ]
    return sum(samples) if samples else None


async def model_calls(client: httpx.AsyncClient, metrics_url: str, model: str) -> float | None:
    """Calls `model`'s replicas have finished so far, as Ray last exported them."""
    try:
        response = await client.get(metrics_url, timeout=30)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    return metric_total(response.text, MODEL_CALLS_METRIC, {"model": model})
