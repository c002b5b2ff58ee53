"""The Grafana dashboard of our metrics beside Ray Serve's, generated here so every query names a
metric we define: `python -m deployments.observability.grafana render [--check]` writes
k8s/grafana/ray-edge-ai.json (import it by hand) and k8s/grafana-dashboard.yaml (a ConfigMap the
Grafana sidecar picks up by its `grafana_dashboard: "1"` label). The panels themselves are in
`grafana_panels`; this module lays them out as Grafana's JSON model and writes the files."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from deployments.observability.grafana_panels import ROWS, Panel
from deployments.observability.metrics import MODEL_METRICS, ROUTER_METRICS
from deployments.paths import PROJECT_ROOT

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
    "# deployments/observability/grafana_panels.py: edit that and re-render, never this file.\n"
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
