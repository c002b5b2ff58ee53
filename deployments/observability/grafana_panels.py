"""What the Grafana dashboard shows: its rows and panels, each a PromQL query over a metric we
define (deployments.observability.metrics) or one of Ray Serve's. `grafana` renders them as
Grafana's JSON model."""

from __future__ import annotations

from dataclasses import dataclass, field

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
                "Router overhead per model (x-edge-overhead-ms)",
                _quantiles("ray_edge_overhead_seconds", "model"),
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
            Panel(
                "KV cache per replica (bytes, budget, preemptions)",
                (
                    Query(f"ray_edge_model_kv_cache_bytes{{{MODEL}}}", "{{model}} {{replica}}"),
                    Query(
                        f"ray_edge_model_kv_cache_budget_bytes{{{MODEL}}}",
                        "budget {{model}} {{replica}}",
                    ),
                    Query(
                        "sum by (model) "
                        f"(increase(ray_edge_model_kv_preemptions_total{{{MODEL}}}[5m]))",
                        "preemptions/5m {{model}}",
                    ),
                ),
                "bytes",
                description="Chat replicas' KV cache against their kv_budget_mb; preemptions "
                "mean the budget is the bottleneck",
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
                "Cache hit ratio per model (joined: an identical request's answer, waited for)",
                (
                    # Both answered with no model call of their own: both are hits.
                    Query(
                        _share("ray_edge_cache_lookups_total", 'result=~"hit|joined"'),
                        "{{model}}",
                    ),
                    Query(
                        _share("ray_edge_cache_lookups_total", 'result="joined"'),
                        "{{model}} joined",
                    ),
                ),
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
