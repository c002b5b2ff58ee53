"""The Grafana dashboard: generated, committed up to date, naming only metrics that exist, and
shipped as a ConfigMap the Grafana sidecar picks up."""

from __future__ import annotations

import json

import yaml

from deployments.observability import grafana


def test_every_query_names_a_metric_we_or_ray_serve_export():
    board = grafana.dashboard()
    named = grafana.metric_names(board)
    assert named, "the dashboard has queries"
    assert named <= grafana.defined_metric_names(), named - grafana.defined_metric_names()
    # What the issue asks to see is there.
    for wanted in (
        "ray_edge_requests_total",
        "ray_edge_request_duration_seconds_bucket",
        "ray_gen_ai_server_time_to_first_token_seconds_bucket",
        "ray_edge_output_tokens_total",
        "ray_edge_cold_starts_total",
        "ray_edge_cold_start_phase_seconds_sum",
        "ray_serve_deployment_replica_healthy",
        "ray_edge_route_decisions_total",
        "ray_edge_rate_limited_total",
        "ray_edge_moderation_flags_total",
        "ray_edge_key_cost_units_total",
    ):
        assert wanted in named, wanted


def test_panels_are_laid_out_without_overlap_and_have_unique_ids():
    panels = grafana.dashboard()["panels"]
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    cells = set()
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, panel["title"]
                cells.add((x, y))
        if panel["type"] != "row":
            assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}"


def test_the_committed_files_are_up_to_date_and_the_configmap_carries_the_dashboard():
    assert grafana.main(["render", "--check"]) == 0
    configmap = yaml.safe_load(grafana.CONFIGMAP_YAML.read_text())
    assert configmap["kind"] == "ConfigMap"
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(configmap["data"]["ray-edge-ai.json"])
    assert shipped == json.loads(grafana.DASHBOARD_JSON.read_text()) == grafana.dashboard()
