"""The Grafana dashboard of our metrics beside Ray Serve's, generated here so every query names a
metric we define: `python -m deployments.observability.grafana render [--check]` writes
k8s/grafana/ray-edge-ai.json (import it by hand) and k8s/grafana-dashboard.yaml (a ConfigMap the
Grafana sidecar picks up by its `grafana_dashboard: "1"` label)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from deployments.config import PROJECT_ROOT
from deployments.observability.metrics import MODEL_METRICS, ROUTER_METRICS

DASHBOARD_UID = "ray-edge-ai"
DASHBOARD_JSON = PROJECT_ROOT / "k8s" / "grafana" / "ray-edge-ai.json"
CONFIGMAP_YAML = PROJECT_ROOT / "k8s" / "grafana-dashboard.yaml"
RAY_PREFIX = "ray_"  # Ray's Prometheus export prefixes every metric
# Ray Serve's own metrics the dashboard shows (exported by its controller and replicas).
RAY_SERVE_METRICS = (
    "ray_serve_deployment_replica_healthy",
    "ray_serve_autoscaling_target_replicas",
    "ray_serve_replica_processing_queries",
)
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")
_METRIC_IN_QUERY = re.compile(r"\bray_[a-z0-9_]+")
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
MODEL = 'model=~"$model"'
RATE = "[$__rate_interval]"
EDGE_APP = 'application="edge"'  # the Serve application in serve_config.yaml


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: str = "timeseries"  # timeseries | table | bargauge
    description: str = ""
    width: int = 8


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)


def _quantiles(metric: str, by: str, where: str = MODEL) -> tuple[Query, ...]:
    return tuple(
        Query(
            f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{{{where}}}{RATE})))",
            f"p{int(q * 100)} " + " ".join(f"{{{{{label}}}}}" for label in by.split(", ")),
        )
        for q in (0.5, 0.99)
    )


def _rate(metric: str, by: str, where: str = MODEL) -> str:
    return f"sum by ({by}) (rate({metric}{{{where}}}{RATE}))"


def _share(metric: str, where: str) -> str:
    """Per model: the rate of the series matching `where` over the rate of all of them."""
    return f"{_rate(metric, 'model', f'{MODEL}, {where}')} / {_rate(metric, 'model')}"


def _top(metric: str, legend: str = "{{key_id}}") -> tuple[Query, ...]:
    return (Query(f"topk(10, sum by (key_id) (increase({metric}{{{MODEL}}}[$__range])))", legend),)


def _phase_mean() -> str:
    metric = "ray_edge_cold_start_phase_seconds"
    total = f"sum by (model, phase) (increase({metric}_sum{{{MODEL}}}[$__range]))"
    count = f"sum by (model, phase) (increase({metric}_count{{{MODEL}}}[$__range]))"
    return f"{total} / {count}"


ROWS: tuple[Row, ...] = (
    Row(
        "Traffic and errors",
        (
            Panel(
                "Requests/s per model",
                (Query(_rate("ray_edge_requests_total", "model"), "{{model}}"),),
                "reqps",
            ),
            Panel(
                "Requests/s per serving region",
                (Query(_rate("ray_edge_requests_total", "region"), "{{region}}"),),
                "reqps",
            ),
            Panel(
                "Requests/s per entry colo",
                (Query(_rate("ray_edge_requests_total", "colo"), "{{colo}}"),),
                "reqps",
            ),
            Panel(
                "Errors/s by status",
                (
                    Query(
                        _rate(
                            "ray_edge_requests_total", "model, status", f'{MODEL}, status=~"[45].."'
                        ),
                        "{{model}} {{status}}",
                    ),
                ),
                "reqps",
            ),
            Panel(
                "5xx share per model",
                (Query(_share("ray_edge_requests_total", 'status=~"5.."'), "{{model}}"),),
                "percentunit",
            ),
            Panel(
                "Request duration per model",
                _quantiles("ray_edge_request_duration_seconds", "model"),
                "s",
            ),
            Panel(
                "p99 request duration per colo",
                (
                    Query(
                        "histogram_quantile(0.99, sum by (le, colo) "
                        f"(rate(ray_edge_request_duration_seconds_bucket{{{MODEL}}}{RATE})))",
                        "{{colo}}",
                    ),
                ),
                "s",
            ),
        ),
    ),
    Row(
        "Generation (OpenTelemetry GenAI)",
        (
            Panel(
                "Time to first token",
                _quantiles(
                    "ray_gen_ai_server_time_to_first_token_seconds",
                    "gen_ai_request_model",
                    'gen_ai_request_model=~"$model"',
                ),
                "s",
            ),
            Panel(
                "Output tokens/s per model",
                (
                    Query(_rate("ray_edge_output_tokens_total", "model"), "{{model}} total"),
                    Query(
                        "histogram_quantile(0.5, sum by (le, model) "
                        f"(rate(ray_edge_output_tokens_per_second_bucket{{{MODEL}}}{RATE})))",
                        "{{model}} p50 per request",
                    ),
                ),
                "short",
            ),
            Panel(
                "Time per output token",
                _quantiles(
                    "ray_gen_ai_server_time_per_output_token_seconds",
                    "gen_ai_request_model",
                    'gen_ai_request_model=~"$model"',
                ),
                "s",
            ),
            Panel(
                "GenAI request duration by operation and error",
                (
                    Query(
                        "histogram_quantile(0.99, sum by (le, gen_ai_operation_name, error_type) "
                        f"(rate(ray_gen_ai_server_request_duration_seconds_bucket{RATE})))",
                        "p99 {{gen_ai_operation_name}} {{error_type}}",
                    ),
                ),
                "s",
            ),
            Panel(
                "Tokens per request (p50)",
                (
                    Query(
                        "histogram_quantile(0.5, sum by "
                        "(le, gen_ai_request_model, gen_ai_token_type) "
                        f"(rate(ray_gen_ai_client_token_usage_bucket{RATE})))",
                        "{{gen_ai_request_model}} {{gen_ai_token_type}}",
                    ),
                ),
                "short",
            ),
            Panel(
                "Queue wait in the replica (p99)",
                (
                    Query(
                        "histogram_quantile(0.99, sum by (le, model) "
                        f"(rate(ray_edge_model_queue_wait_seconds_bucket{{{MODEL}}}{RATE})))",
                        "{{model}}",
                    ),
                ),
                "s",
            ),
        ),
    ),
    Row(
        "Cold starts and replicas",
        (
            Panel(
                "Cold starts per model",
                (
                    Query(
                        f"sum by (model) (increase(ray_edge_cold_starts_total{{{MODEL}}}[5m]))",
                        "{{model}}",
                    ),
                ),
                "short",
                description="Requests that waited on a replica starting, over 5 minutes",
            ),
            Panel(
                "Cold-start wait", _quantiles("ray_edge_cold_start_duration_seconds", "model"), "s"
            ),
            Panel(
                "Cold-start phases (mean over the range)",
                (Query(_phase_mean(), "{{model}} {{phase}}"),),
                "s",
                kind="bargauge",
            ),
            Panel(
                "Healthy replicas per deployment",
                (
                    Query(
                        f"sum by (deployment) (ray_serve_deployment_replica_healthy{{{EDGE_APP}}})",
                        "{{deployment}} running",
                    ),
                    Query(
                        "max by (deployment) "
                        f"(ray_serve_autoscaling_target_replicas{{{EDGE_APP}}})",
                        "{{deployment}} wanted",
                    ),
                ),
                "short",
                width=12,
            ),
            Panel(
                "Requests in replicas",
                (
                    Query(
                        f"sum by (deployment) (ray_serve_replica_processing_queries{{{EDGE_APP}}})",
                        "{{deployment}}",
                    ),
                ),
                "short",
                width=12,
            ),
        ),
    ),
    Row(
        "Edge routing",
        (
            Panel(
                "Route reasons",
                (Query(_rate("ray_edge_route_decisions_total", "reason"), "{{reason}}"),),
                "reqps",
            ),
            Panel(
                "Failovers per failed region (none: a drilled entry colo)",
                (
                    Query(
                        _rate("ray_edge_failovers_total", "region, colo"), "{{region}} via {{colo}}"
                    ),
                ),
                "reqps",
            ),
            Panel(
                "Cache hit ratio per model",
                (Query(_share("ray_edge_cache_lookups_total", 'result="hit"'), "{{model}}"),),
                "percentunit",
            ),
        ),
    ),
    Row(
        "Gateway: limits, moderation, usage per key",
        (
            Panel(
                "Rate-limit rejections (429)/s",
                (Query(_rate("ray_edge_rate_limited_total", "model"), "{{model}}"),),
                "reqps",
            ),
            Panel(
                "Moderation flags/s by category",
                (Query(_rate("ray_edge_moderation_flags_total", "category"), "{{category}}"),),
                "short",
            ),
            Panel("Top keys by requests", _top("ray_edge_key_requests_total"), kind="table"),
            Panel("Top keys by cost units", _top("ray_edge_key_cost_units_total"), kind="table"),
            Panel(
                "Top keys by input tokens", _top("ray_edge_key_input_tokens_total"), kind="table"
            ),
            Panel(
                "Top keys by output tokens", _top("ray_edge_key_output_tokens_total"), kind="table"
            ),
        ),
    ),
)


def _panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    instant = panel.kind in ("table", "bargauge")
    body: dict[str, Any] = {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "targets": [
            {
                "refId": chr(ord("A") + index),
                "datasource": DATASOURCE,
                "expr": query.expr,
                "legendFormat": query.legend,
                "instant": instant,
                "range": not instant,
                **({"format": "table"} if panel.kind == "table" else {}),
            }
            for index, query in enumerate(panel.queries)
        ],
    }
    if panel.description:
        body["description"] = panel.description
    if panel.kind == "table":
        body["transformations"] = [
            {"id": "sortBy", "options": {"sort": [{"field": "Value", "desc": True}]}}
        ]
    return body


def _template(name: str, query: str, label: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": name},
        "definition": query,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"text": "All", "value": "$__all"},
        "refresh": 2,
    }


def dashboard() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (schema 39), importable as is."""
    panels: list[dict[str, Any]] = []
    y = 0
    for row in ROWS:
        panels.append(
            {
                "id": len(panels) + 1,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        y, x = y + 1, 0
        for panel in row.panels:
            if x + panel.width > 24:
                y, x = y + 8, 0
            panels.append(_panel_json(panel, len(panels) + 1, x, y))
            x += panel.width
        y += 8
    return {
        "uid": DASHBOARD_UID,
        "title": "ray-edge-ai: the edge",
        "description": "Traffic, latency, generation, cold starts, routing and usage per key",
        "tags": ["ray-edge-ai", "ray-serve", "gen-ai"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                },
                _template("model", "label_values(ray_edge_requests_total, model)", "Model"),
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }


def queries(board: dict[str, Any]) -> Iterator[str]:
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            yield target["expr"]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            yield variable["query"]["query"]


def metric_names(board: dict[str, Any]) -> set[str]:
    """Every metric (as exported, with Ray's prefix and any histogram suffix) a query names."""
    return {name for expr in queries(board) for name in _METRIC_IN_QUERY.findall(expr)}


def defined_metric_names() -> set[str]:
    """The exported names of our metrics (a histogram's three series each) and Ray Serve's."""
    names = set(RAY_SERVE_METRICS)
    for spec in (*ROUTER_METRICS.values(), *MODEL_METRICS.values()):
        exported = RAY_PREFIX + spec.name
        if spec.kind == "histogram":
            names.update(exported + suffix for suffix in HISTOGRAM_SERIES)
        else:
            names.add(exported)
    return names


def configmap(board: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "ray-edge-ai-grafana-dashboard",
            # Grafana's dashboard sidecar (kube-prometheus-stack) loads ConfigMaps with this label.
            "labels": {"grafana_dashboard": "1", "app.kubernetes.io/part-of": "ray-edge-ai"},
        },
        "data": {"ray-edge-ai.json": dashboard_text(board)},
    }


def dashboard_text(board: dict[str, Any]) -> str:
    return json.dumps(board, indent=2, sort_keys=False) + "\n"


GENERATED = (
    "# GENERATED by `python -m deployments.observability.grafana render` from\n"
    "# deployments/observability/grafana.py: edit that and re-render, never this file.\n"
)


def rendered() -> dict[Path, str]:
    board = dashboard()
    configmap_text = GENERATED + yaml.safe_dump(configmap(board), sort_keys=False, width=1000)
    return {DASHBOARD_JSON: dashboard_text(board), CONFIGMAP_YAML: configmap_text}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("command", choices=["render"])
    parser.add_argument("--check", action="store_true", help="fail if the files are stale")
    args = parser.parse_args(argv)
    stale = []
    for path, text in rendered().items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    for path in stale:
        print(f"{path} is stale: run `python -m deployments.observability.grafana render`")
    if args.check and not stale:
        print("grafana dashboard files are up to date")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
