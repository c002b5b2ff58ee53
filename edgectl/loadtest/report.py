"""Writes a run's outputs into one folder: summary.json, requests.csv, replicas.csv, the PNGs
and report.md (tables of the summary with the plots embedded)."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edgectl.loadtest.plots import (
    COLD_VS_WARM,
    LATENCY_BY_COLO,
    LATENCY_OVER_TIME,
    plot_cold_vs_warm,
    plot_latency_by_colo,
    plot_latency_over_time,
)
from edgectl.loadtest.records import write_csv
from edgectl.loadtest.replicas import ReplicaSample
from edgectl.loadtest.runner import RunResult
from edgectl.loadtest.summary import summarize

SUMMARY_JSON = "summary.json"
REQUESTS_CSV = "requests.csv"
REPLICAS_CSV = "replicas.csv"
REPORT_MD = "report.md"


def write_outputs(result: RunResult, out_dir: Path, params: Mapping[str, Any]) -> dict[str, Any]:
    """Write every output file; returns the summary."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(result, params)
    (out_dir / SUMMARY_JSON).write_text(
        json.dumps(summary, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    write_csv(result.records, out_dir / REQUESTS_CSV)
    write_replicas_csv(result.replica_samples, out_dir / REPLICAS_CSV)
    plot_latency_over_time(result, out_dir / LATENCY_OVER_TIME)
    plot_cold_vs_warm(result, out_dir / COLD_VS_WARM)
    plot_latency_by_colo(summary["by_colo"], out_dir / LATENCY_BY_COLO)
    (out_dir / REPORT_MD).write_text(render_report(summary), encoding="utf-8")
    return summary


def write_replicas_csv(samples: Sequence[ReplicaSample], path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["t_s", "deployment", "running", "wanted", "status"])
        for s in sorted(samples, key=lambda s: (s.t_s, s.deployment)):
            writer.writerow([f"{s.t_s:.3f}", s.deployment, s.running, s.wanted, s.status])


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines + [""]


def _errors(group: Mapping[str, Any]) -> str:
    errors = group["errors"]
    return ", ".join(f"{label}: {n}" for label, n in errors.items()) if errors else "0"


def render_report(summary: Mapping[str, Any]) -> str:
    requests, overall, cold = summary["requests"], summary["overall"], summary["cold_start"]
    params = summary["params"]
    lag = summary["send_lag_ms"]
    lines = [
        f"# Load test: {summary['scenario']}",
        "",
        f"Target `{params.get('url', '?')}`, seed {params.get('seed', '?')}, "
        f"{requests['scheduled']} requests scheduled over {summary['elapsed_s']:.1f} s "
        f"(offered {requests['offered_rps'] or 0:.2f} req/s while active); "
        f"**{requests['ok']} ok, {requests['errors']} failed**."
        + (" **The run was interrupted before its end.**" if summary["interrupted"] else ""),
        "",
        "Latency counts from each request's *scheduled* send time (open loop: a slow server "
        "cannot hold the sender back and hide its own slowness). Send lag p99 "
        f"{_ms(lag['p99'])} ms, max {_ms(lag['max'])} ms: how late the sender itself was.",
        "",
        f"Overall p50 / p95 / p99: {_ms(overall['latency_ms']['p50'])} / "
        f"{_ms(overall['latency_ms']['p95'])} / {_ms(overall['latency_ms']['p99'])} ms. "
        f"Cold starts: {cold['count']} (duration p50 {_ms(cold['duration_ms']['p50'])} ms, "
        f"p95 {_ms(cold['duration_ms']['p95'])} ms); warm p50 "
        f"{_ms(cold['warm_latency_ms']['p50'])} ms vs cold p50 "
        f"{_ms(cold['cold_latency_ms']['p50'])} ms.",
        "",
        "## Per model",
        "",
    ]
    lines += _table(
        [
            "model", "requests", "errors", "p50 ms", "p95 ms", "p99 ms", "TTFT p50 ms",
            "tokens/s p50", "cold starts", "cold start p50/p95 ms", "warm p50 ms", "cold p50 ms",
        ],
        [
            [
                model, g["requests"], _errors(g), _ms(g["latency_ms"]["p50"]),
                _ms(g["latency_ms"]["p95"]), _ms(g["latency_ms"]["p99"]),
                _ms(g["ttft_ms"]["p50"]), _ms(g["decode_tokens_per_s"]["p50"]),
                g["cold_starts"],
                f"{_ms(g['cold_start_ms']['p50'])} / {_ms(g['cold_start_ms']['p95'])}",
                _ms(g["warm_latency_ms"]["p50"]), _ms(g["cold_latency_ms"]["p50"]),
            ]
            for model, g in summary["by_model"].items()
        ],
    )  # fmt: skip
    lines += ["## Per colo", ""]
    lines += _table(
        ["colo", "requests", "errors", "p50 ms", "p95 ms", "p99 ms", "RTT p50 ms", "route reasons"],
        [
            [
                colo, g["requests"], _errors(g), _ms(g["latency_ms"]["p50"]),
                _ms(g["latency_ms"]["p95"]), _ms(g["latency_ms"]["p99"]), _ms(g["rtt_ms"]["p50"]),
                ", ".join(f"{k}: {n}" for k, n in g["route_reasons"].items()),
            ]
            for colo, g in summary["by_colo"].items()
        ],
    )  # fmt: skip
    if len(summary["by_region"]) > 1:
        lines += ["## Per client region", ""]
        lines += _table(
            ["region", "requests", "errors", "p50 ms", "p95 ms"],
            [
                [region, g["requests"], _errors(g), _ms(g["latency_ms"]["p50"]),
                 _ms(g["latency_ms"]["p95"])]
                for region, g in summary["by_region"].items()
            ],
        )  # fmt: skip
    if len(summary["phases"]) > 1:
        lines += ["## Per phase", ""]
        lines += _table(
            ["phase", "requests", "errors", "p50 ms", "p95 ms", "cold starts"],
            [
                [phase, g["requests"], _errors(g), _ms(g["latency_ms"]["p50"]),
                 _ms(g["latency_ms"]["p95"]), g["cold_starts"]]
                for phase, g in (
                    (p["name"], summary["by_phase"][p["name"]])
                    for p in summary["phases"]
                    if p["name"] in summary["by_phase"]
                )
            ],
        )  # fmt: skip
    if summary["errors"]["examples"]:
        lines += ["## Errors", ""]
        lines += [
            f"- `{label}` ×{summary['errors']['by_label'][label]}: {example}"
            for label, example in summary["errors"]["examples"].items()
        ]
        lines.append("")
    lines += ["## Replicas (from the Ray dashboard)", ""]
    sampling = summary["replica_sampling"]
    if summary["replicas"]:
        phase_names = [p["name"] for p in summary["phases"]]
        lines += _table(
            ["deployment", "samples", "running min–max", "wanted max"]
            + [f"running at {name} start" for name in phase_names],
            [
                [name, r["samples"], f"{r['min_running']}–{r['max_running']}", r["max_wanted"]]
                + [_count(r["running_at_phase_start"].get(p)) for p in phase_names]
                for name, r in summary["replicas"].items()
            ],
        )
    else:
        lines += ["Not sampled (--no-replicas, or the Ray dashboard never answered).", ""]
    if sampling["errors"]:
        lines += [f"The Ray dashboard failed {sampling['errors']} times; last: "
                  f"{(sampling['recent_errors'] or ['?'])[-1]}", ""]  # fmt: skip
    if summary["admin_events"]:
        lines += ["## Admin actions", ""]
        lines += _table(
            ["at s", "action", "colo", "status"],
            [
                [f"{e['at_s']:.1f}", e["label"], e["colo"], e["status"] or e["error"]]
                for e in summary["admin_events"]
            ],
        )
    lines += [
        "## Plots",
        "",
        f"![Latency over time, with replicas per model]({LATENCY_OVER_TIME})",
        "",
        f"![Cold vs warm latency]({COLD_VS_WARM})",
        "",
        f"![Latency per colo]({LATENCY_BY_COLO})",
        "",
        f"Raw data: [`{REQUESTS_CSV}`]({REQUESTS_CSV}), [`{REPLICAS_CSV}`]({REPLICAS_CSV}), "
        f"[`{SUMMARY_JSON}`]({SUMMARY_JSON}).",
        "",
    ]
    return "\n".join(lines)


def _count(value: int | None) -> str:
    return "–" if value is None else str(value)
