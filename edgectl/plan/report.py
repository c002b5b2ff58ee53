"""The planner's outputs in one folder: summary.json, report.md and PNGs (matplotlib's Agg
canvas, as the load tester's): replicas over time per region, requests over time per region,
and, with several policies, cold starts against replica-seconds."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from edge_sim.plan.policies import Policy
from edge_sim.plan.simulator import SimulationResult
from edge_sim.plan.summary import extra_replica_share, hidden_share, pool_rows, totals
from edgectl.plan.sources.scope import skipped_text

SUMMARY_JSON = "summary.json"
REPORT_MD = "report.md"
REPLICAS_PNG = "replicas_over_time.png"
REQUESTS_PNG = "requests_over_time.png"
POLICIES_PNG = "policies.png"
DPI = 100


def write_plan_report(
    runs: Sequence[tuple[Policy, SimulationResult]], out_dir: Path, params: dict[str, Any]
) -> dict[str, Any]:
    """Every output file for these runs (the first is the baseline); returns the summary."""
    out_dir.mkdir(parents=True, exist_ok=True)
    baseline_policy, baseline = runs[0]
    base_totals = totals(baseline)
    policies = []
    for policy, result in runs:
        row = {"policy": policy.name, "description": policy.description, **totals(result)}
        row["hidden_vs_baseline"] = hidden_share(row, base_totals)
        row["extra_replica_s_vs_baseline"] = extra_replica_share(row, base_totals)
        policies.append(row)
    summary = {
        "params": params,
        "baseline": baseline_policy.name,
        "totals": base_totals,
        "pools": pool_rows(baseline),
        "policies": policies,
    }
    (out_dir / SUMMARY_JSON).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    plot_replicas(baseline, out_dir / REPLICAS_PNG)
    plot_requests(baseline, out_dir / REQUESTS_PNG)
    if len(runs) > 1:
        plot_policies(policies, out_dir / POLICIES_PNG)
    (out_dir / REPORT_MD).write_text(render(summary, len(runs) > 1), encoding="utf-8")
    return summary


def replay_line(replay: dict[str, Any]) -> str:
    """What a replayed trace holds and left out (`params["replay"]`), for the output and the
    report."""
    started = replay.get("started_at_utc")
    at = f", t = 0 at {started}" if started else ""
    skipped = replay.get("skipped") or {}
    left = f"; not replayed: {skipped_text(skipped)}" if skipped else ""
    return f"Replayed {replay['requests']:,} requests{at}{left}."


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join("–" if c is None else str(c) for c in row) + " |" for row in rows]
    return lines + [""]


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.1f}%"


def render(summary: dict[str, Any], with_policies: bool) -> str:
    t, params = summary["totals"], summary["params"]
    lines = [
        "# Capacity plan",
        "",
        f"Config `{params.get('config')}`, trace {params.get('trace')}, "
        f"{t['arrivals']:,} requests over {params.get('duration_s', 0) / 3600:.1f} h "
        f"(figures from {params.get('measure_from_s', 0):g} s on), policy "
        f"`{summary['baseline']}`: **p50 {t['p50_ms']} ms, p99 {t['p99_ms']} ms** (RTT "
        f"included), {t['cold_starts']:,} requests met a cold start ({_pct(t['cold_share'])}), "
        f"{t['sheds']:,} shed, {t['replica_s'] / 3600:,.1f} replica-hours, "
        f"{t['cost_units'] / 3600:,.1f} cost-unit hours (num_gpus x hours). Simulated in "
        f"{t['wall_s']} s; {t['route_computations']:,} routing decisions computed, "
        f"{t['route_cache_hits']:,} reused.",
        "",
    ]
    if "replay" in params:
        lines += [replay_line(params["replay"]), ""]
    lines += [
        "## Per region and model",
        "",
    ]
    lines += _table(
        ["region", "model", "requests", "p50 ms", "p99 ms", "cold", "cold share", "queued",
         "replica-h", "cost-h", "max replicas", "starts from 0", "shed", "failed attempts"],
        [
            [r["region"], r["model"], f"{r['requests']:,}", r["p50_ms"], r["p99_ms"],
             r["cold_starts"], _pct(r["cold_share"]), r["queued"],
             f"{r['replica_s'] / 3600:.2f}", f"{r['cost_units'] / 3600:.2f}", r["max_replicas"],
             r["scale_from_zero"], r["sheds"], r["failed_attempts"]]
            for r in summary["pools"]
        ],
    )  # fmt: skip
    lines += [f"![replicas over time]({REPLICAS_PNG})", "", f"![requests]({REQUESTS_PNG})", ""]
    if with_policies:
        lines += ["## Policies on the same trace", ""]
        lines += _table(
            ["policy", "what", "cold starts", "hidden vs first", "replica-h", "extra vs first",
             "p50 ms", "p99 ms", "shed"],
            [
                [p["policy"], p["description"], f"{p['cold_starts']:,}",
                 _pct(p["hidden_vs_baseline"]), f"{p['replica_s'] / 3600:.1f}",
                 _pct(p["extra_replica_s_vs_baseline"]), p["p50_ms"], p["p99_ms"], p["sheds"]]
                for p in summary["policies"]
            ],
        )  # fmt: skip
        lines += [f"![policies]({POLICIES_PNG})", ""]
    return "\n".join(lines)


def _figure(rows: int = 1) -> tuple[Figure, Any]:
    figure = Figure(figsize=(10, 3.2 * rows), dpi=DPI)
    FigureCanvasAgg(figure)
    return figure, figure.subplots(rows, 1, squeeze=False)[:, 0]


def _save(figure: Figure, path: Path) -> None:
    figure.tight_layout()
    figure.savefig(path)


def running_on_grid(result: SimulationResult, model: str, region: str, grid: np.ndarray):
    """Running replicas of one pool at each grid time (its timeline is a step function)."""
    timeline = result.pools[(model, region)].timeline
    if not timeline:
        return np.zeros(len(grid))
    times = np.array([t for t, _, _ in timeline])
    running = np.array([r for _, r, _ in timeline])
    index = np.searchsorted(times, grid, side="right") - 1
    return np.where(index >= 0, running[np.maximum(index, 0)], 0)


def plot_replicas(result: SimulationResult, path: Path) -> None:
    """Running replicas of every model, summed per region, over hours."""
    figure, (axes,) = _figure()
    grid = np.linspace(0.0, result.duration_s, 2000)
    for region in result.regions[:20]:
        total = sum(running_on_grid(result, m, region, grid) for m in result.models)
        axes.step(grid / 3600, total, where="post", label=region, linewidth=1)
    axes.set_xlabel("hours")
    axes.set_ylabel("running replicas (all models)")
    axes.legend(ncol=10, fontsize=7, loc="upper left")
    _save(figure, path)


def plot_requests(result: SimulationResult, path: Path) -> None:
    figure, (axes,) = _figure()
    hours = np.arange(result.requests_timeline.shape[1]) * result.timeline_s / 3600
    for index, region in enumerate(result.regions[:20]):
        axes.plot(hours, result.requests_timeline[index] / result.timeline_s, label=region, lw=1)
    axes.set_xlabel("hours")
    axes.set_ylabel("requests/s served")
    axes.legend(ncol=10, fontsize=7, loc="upper left")
    _save(figure, path)


def plot_policies(policies: Sequence[dict[str, Any]], path: Path) -> None:
    figure, (axes,) = _figure()
    for row in policies:
        axes.scatter(row["replica_s"] / 3600, row["cold_starts"])
        axes.annotate(row["policy"], (row["replica_s"] / 3600, row["cold_starts"]), fontsize=8)
    axes.set_xlabel("replica-hours")
    axes.set_ylabel("requests that met a cold start")
    _save(figure, path)
