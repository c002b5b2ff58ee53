"""The report's PNGs, drawn with matplotlib's Agg canvas (no pyplot, no display, no global
backend switch): latency over time with replicas, cold vs warm latency, latency per colo."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, NullFormatter, ScalarFormatter
from numpy.lib.stride_tricks import sliding_window_view

from edgectl.loadtest.records import RequestRecord
from edgectl.loadtest.runner import RunResult

LATENCY_OVER_TIME = "latency_over_time.png"
COLD_VS_WARM = "cold_vs_warm.png"
LATENCY_BY_COLO = "latency_by_colo.png"
PHASE_COLOURS = {"idle": "0.85", "outage": "#f4b6b6", "warm": "#d8ecd8"}
MIN_WINDOW, MAX_WINDOW = 5, 50  # requests per rolling-p95 window
LOG_SCALE_SPREAD = 20  # a latency axis turns logarithmic when max / min passes this
DPI = 100


def _wide(values: np.ndarray) -> bool:
    positive = values[values > 0]
    return positive.size > 1 and positive.max() / positive.min() > LOG_SCALE_SPREAD


def _log_axis(axis: Any) -> None:
    """Log scale labelled in plain milliseconds (10, 100, 1000), not as powers of ten."""
    axis.set_major_formatter(ScalarFormatter())
    axis.set_minor_formatter(NullFormatter())


def _save(figure: Figure, path: Path) -> None:
    FigureCanvasAgg(figure)
    # No "Software" tag: the same run data gives the same bytes.
    figure.savefig(path, format="png", dpi=DPI, metadata={"Software": None})


def _models(result: RunResult) -> list[str]:
    return sorted(
        {a.model.name for a in result.schedule.arrivals} | {r.model for r in result.records}
    )


def _mark_phases_and_events(ax: Axes, result: RunResult) -> None:
    for phase in result.schedule.phases:
        colour = PHASE_COLOURS.get(phase.name)
        if colour is not None and phase.end_s > phase.start_s:
            ax.axvspan(phase.start_s, phase.end_s, color=colour, alpha=0.5, lw=0, zorder=0)
    for event in result.admin_events:
        ax.axvline(event.at_s, color="tab:red", ls="--", lw=1)
        ax.annotate(
            event.label,
            (event.at_s, 1.0),
            xycoords=("data", "axes fraction"),
            rotation=90,
            va="top",
            ha="right",
            fontsize=7,
            color="tab:red",
        )


def _rolling_p95(records: Sequence[RequestRecord]) -> tuple[np.ndarray, np.ndarray, int]:
    """p95 over the last k requests at each request's time; k grows with the run (5..50), so
    the line follows the load whatever the rate."""
    ordered = sorted(records, key=lambda r: r.scheduled_s)
    k = int(np.clip(len(ordered) // 10, MIN_WINDOW, MAX_WINDOW))
    if len(ordered) < k:
        return np.empty(0), np.empty(0), k
    t = np.array([r.scheduled_s for r in ordered])
    latency = np.array([r.latency_ms for r in ordered], dtype=float)
    p95 = np.percentile(sliding_window_view(latency, k), 95, axis=1)
    return t[k - 1 :], p95, k


def plot_latency_over_time(result: RunResult, path: Path) -> None:
    """One panel per model: each request's latency at its scheduled time (warm, cold start,
    error), a rolling p95, and the model's replicas (running, and wanted) on a twin axis."""
    models = _models(result) or ["(no requests)"]
    figure = Figure(figsize=(11, 2.8 * len(models) + 0.8), layout="constrained")
    axes = figure.subplots(len(models), 1, sharex=True, squeeze=False)[:, 0]
    end_s = max(result.schedule.end_s, result.elapsed_s)
    for ax, model in zip(axes, models, strict=True):
        records = [r for r in result.records if r.model == model]
        warm = [r for r in records if r.ok and not r.cold_start]
        cold = [r for r in records if r.ok and r.cold_start]
        failed = [r for r in records if not r.ok and r.latency_ms is not None]
        _mark_phases_and_events(ax, result)
        for group, style in (
            (warm, {"s": 8, "color": "tab:blue", "label": "warm", "alpha": 0.6}),
            (cold, {"s": 30, "color": "tab:orange", "marker": "^", "label": "cold start"}),
            (failed, {"s": 20, "color": "tab:red", "marker": "x", "label": "error"}),
        ):
            if group:
                ax.scatter([r.scheduled_s for r in group], [r.latency_ms for r in group], **style)
        t_p95, p95, window = _rolling_p95(warm + cold)
        if t_p95.size:
            ax.plot(t_p95, p95, color="black", lw=1.2, label=f"p95 of last {window}")
        if _wide(np.array([r.latency_ms for r in records if r.latency_ms], dtype=float)):
            ax.set_yscale("log")
            _log_axis(ax.yaxis)
        ax.set_ylabel("latency ms")
        ax.set_title(model, loc="left", fontsize=10)
        samples = sorted(
            (s for s in result.replica_samples if s.deployment == model), key=lambda s: s.t_s
        )
        handles, labels = ax.get_legend_handles_labels()
        if samples:
            twin = ax.twinx()
            t = [s.t_s for s in samples]
            twin.step(
                t,
                [s.running for s in samples],
                where="post",
                color="tab:green",
                lw=2,
                label="replicas running",
            )
            twin.step(
                t,
                [s.wanted for s in samples],
                where="post",
                color="tab:green",
                lw=1,
                ls=":",
                label="replicas wanted",
            )
            twin.set_ylim(0, max(s.wanted for s in samples) + 1)
            twin.yaxis.set_major_locator(MaxNLocator(integer=True))
            twin.set_ylabel("replicas")
            more_handles, more_labels = twin.get_legend_handles_labels()
            handles, labels = handles + more_handles, labels + more_labels
        if handles:
            ax.legend(handles, labels, loc="upper left", fontsize=7, ncols=3)
    axes[-1].set_xlabel("seconds since start (scheduled send time)")
    axes[-1].set_xlim(0, end_s)
    _save(figure, path)


def plot_cold_vs_warm(result: RunResult, path: Path) -> None:
    """Per model, the latency distribution of warm requests and of cold-start requests."""
    models = _models(result) or ["(no requests)"]
    figure = Figure(figsize=(11, 2.4 * len(models) + 0.6), layout="constrained")
    axes = figure.subplots(len(models), 1, squeeze=False)[:, 0]
    for ax, model in zip(axes, models, strict=True):
        ok = [r for r in result.records if r.model == model and r.ok and r.latency_ms]
        warm = np.array([r.latency_ms for r in ok if not r.cold_start], dtype=float)
        cold = np.array([r.latency_ms for r in ok if r.cold_start], dtype=float)
        ax.set_title(model, loc="left", fontsize=10)
        if warm.size + cold.size == 0:
            ax.text(0.5, 0.5, "no successful requests", ha="center", transform=ax.transAxes)
            continue
        every = np.concatenate([warm, cold])
        low, high = max(every.min(), 0.1), max(every.max(), 0.2)
        wide = _wide(every)
        bins = np.geomspace(low, high, 40) if wide else np.linspace(low, high, 40)
        if warm.size:
            ax.hist(warm, bins=bins, alpha=0.6, color="tab:blue", label=f"warm (n={warm.size})")
        if cold.size:
            ax.hist(cold, bins=bins, alpha=0.8, color="tab:orange", label=f"cold (n={cold.size})")
        else:
            ax.text(0.99, 0.9, "no cold starts", ha="right", transform=ax.transAxes, fontsize=8)
        if wide:
            ax.set_xscale("log")
            _log_axis(ax.xaxis)
        ax.set_ylabel("requests")
        ax.legend(loc="upper left", fontsize=7)
    axes[-1].set_xlabel("latency ms (from scheduled send time)")
    _save(figure, path)


def plot_latency_by_colo(by_colo: Mapping[str, Mapping[str, Any]], path: Path) -> None:
    """p50 and p95 latency per colo that answered, with its request count."""
    colos = [c for c, s in by_colo.items() if s["latency_ms"]["count"]]
    figure = Figure(figsize=(9, 0.35 * max(len(colos), 1) + 1.2), layout="constrained")
    ax = figure.subplots()
    if not colos:
        ax.text(0.5, 0.5, "no successful requests", ha="center", transform=ax.transAxes)
        _save(figure, path)
        return
    y = np.arange(len(colos))
    p50 = [by_colo[c]["latency_ms"]["p50"] for c in colos]
    p95 = [by_colo[c]["latency_ms"]["p95"] for c in colos]
    ax.barh(y - 0.2, p50, height=0.4, color="tab:blue", label="p50")
    ax.barh(y + 0.2, p95, height=0.4, color="tab:purple", label="p95")
    ax.set_yticks(y, [f"{c} ({by_colo[c]['requests']})" for c in colos])
    ax.invert_yaxis()
    ax.set_xlabel("latency ms (successful requests)")
    ax.legend(loc="lower right", fontsize=8)
    _save(figure, path)
