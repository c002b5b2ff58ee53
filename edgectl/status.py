"""`edge status [--watch]`: one screen of the platform's state: replicas per model from the Ray
dashboard's REST API (what `serve status` prints), queue and last cold start from the router's
/readyz, colo and region health from /admin/colos."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from edge_sim.clock import Clock
from edgectl.loadtest.replicas import StatusReader
from edgectl.serve_state import ApplicationState, ServeStatusError

HTTP_TIMEOUT_S = 10.0
UNHEALTHY = frozenset({"DEPLOY_FAILED", "UNHEALTHY"})
# Per-model fields of /readyz's `models` entries: `last_cold_start` is
# {at_unix, wait_ms, replica_load_s, ...} or null; queue fields are shown if a router sends them.
READYZ_COLD_START = "last_cold_start"
READYZ_QUEUE_FIELDS = ("in_flight", "queued")


@dataclass(frozen=True)
class StatusView:
    """Everything the screen shows; a source that failed is None and explained in `notes`."""

    app: ApplicationState | None
    router_models: Mapping[str, Mapping[str, Any]] | None
    colos: list[Mapping[str, Any]] | None
    now_unix_s: float
    notes: list[str] = field(default_factory=list)
    failed: bool = False


def gather_status(
    url: str,
    admin_key: str | None,
    read_status: StatusReader,
    *,
    transport: httpx.BaseTransport | None = None,
    wall_clock: Clock = time.time,
) -> StatusView:
    notes: list[str] = []
    failed = False
    try:
        app: ApplicationState | None = read_status()
    except ServeStatusError as error:
        app, failed = None, True
        notes.append(f"replicas unknown: {error}")
    router_models: Mapping[str, Mapping[str, Any]] | None = None
    colos: list[Mapping[str, Any]] | None = None
    with httpx.Client(
        base_url=url, transport=transport, timeout=HTTP_TIMEOUT_S, trust_env=False
    ) as client:
        try:
            response = client.get("/readyz")
            response.raise_for_status()
            router_models = response.json().get("models", {})
        except (httpx.HTTPError, ValueError, AttributeError) as error:
            failed = True
            notes.append(f"router /readyz unreachable: {error}")
        if router_models and not any(READYZ_COLD_START in m for m in router_models.values()):
            notes.append(
                "last cold start unknown: this router does not report it "
                f"(no `{READYZ_COLD_START}` in /readyz models)"
            )
        if not admin_key:
            notes.append("colos not shown: pass --admin-key or set EDGE_ADMIN_KEY")
        else:
            try:
                response = client.get(
                    "/admin/colos", headers={"authorization": f"Bearer {admin_key}"}
                )
                response.raise_for_status()
                body = response.json()
                colos = body if isinstance(body, list) else body.get("colos", [])
            except (httpx.HTTPError, ValueError, AttributeError) as error:
                failed = True
                notes.append(f"colos unknown: GET /admin/colos: {error}")
    return StatusView(app, router_models, colos, wall_clock(), notes, failed)


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def _cold_start(info: Mapping[str, Any] | None, now_unix_s: float) -> str:
    if info is None or READYZ_COLD_START not in info:
        return "unknown"
    last = info[READYZ_COLD_START]
    if not isinstance(last, Mapping) or not isinstance(last.get("at_unix"), int | float):
        return "none since the router started"
    text = _ago(max(0.0, now_unix_s - float(last["at_unix"])))
    if isinstance(last.get("wait_ms"), int | float):
        text += f", waited {last['wait_ms'] / 1000:.1f} s"
    if isinstance(last.get("replica_load_s"), int | float):
        text += f" (model load {last['replica_load_s']:.1f} s)"
    return text


def _queue(info: Mapping[str, Any] | None) -> str:
    parts = [
        f"{name.replace('_', ' ')} {info[name]}"
        for name in READYZ_QUEUE_FIELDS
        if info and name in info
    ]
    return ", ".join(parts) if parts else "n/a"


def _faults(faults: Sequence[Mapping[str, Any]]) -> str:
    described = []
    for fault in faults:
        effects = []
        if fault.get("down"):
            effects.append("down")
        if fault.get("added_latency_ms"):
            effects.append(f"+{fault['added_latency_ms']:g} ms")
        if fault.get("error_rate"):
            effects.append(f"{fault['error_rate']:.0%} errors")
        when = ""
        if fault.get("active") is False and fault.get("starts_in_s") is not None:
            when = f" in {fault['starts_in_s']:.0f} s"
        elif fault.get("ends_in_s") is not None:
            when = f" for {fault['ends_in_s']:.0f} s"
        described.append(" ".join(effects) + when)
    return "; ".join(described) or "–"


def models_table(view: StatusView) -> Table:
    table = Table(title="Models (replicas from the Ray dashboard)", title_justify="left")
    for column in ("deployment", "status", "running / wanted", "replica states", "queue",
                   "last cold start"):  # fmt: skip
        table.add_column(column)
    deployments = dict(view.app.deployments) if view.app else {}
    names = sorted(set(deployments) | set(view.router_models or {}))
    for name in names:
        deployment = deployments.get(name)
        info = (view.router_models or {}).get(name)
        if deployment is None:
            status, replicas, states = "?", "?", "?"
        else:
            status = deployment.status
            replicas = f"{deployment.running} / {deployment.wanted}"
            states = ", ".join(f"{s} {n}" for s, n in sorted(deployment.replica_states.items()))
        table.add_row(
            name, status, replicas, states or "none", _queue(info),
            _cold_start(info, view.now_unix_s) if info is not None else "–",
        )  # fmt: skip
    return table


def colos_table(colos: Sequence[Mapping[str, Any]]) -> Table:
    """The simulated entry points and their drills. What is real about a region (replicas,
    queues, cold starts) is in the models table: Serve's own state per `<model>-<region>`."""
    table = Table(title="Colos (from /admin/colos)", title_justify="left")
    with_region = any(colo.get("region") for colo in colos)
    for column in ("colo", *(("region",) if with_region else ()), "city", "state", "faults",
                   "models"):  # fmt: skip
        table.add_column(column)
    for colo in colos:
        state = "[green]up" if colo.get("healthy") else "[red]down"
        if colo.get("status", "active") != "active":
            state += f" ({colo['status']})"
        models = colo.get("models", "*")
        table.add_row(
            str(colo.get("id", "?")),
            *((str(colo.get("region") or ""),) if with_region else ()),
            str(colo.get("city", "")),
            state,
            _faults(colo.get("faults") or []),
            models if isinstance(models, str) else ", ".join(models),
        )
    return table


def status_screen(view: StatusView) -> RenderableType:
    """The whole screen as one renderable, so `--watch` can redraw it in place."""
    parts: list[RenderableType] = []
    if view.app is not None:
        message = f" – {view.app.message}" if view.app.message else ""
        parts.append(Text.from_markup(f"Application [bold]{view.app.name}[/]: {view.app.status}")
                     + Text(message))  # fmt: skip
    parts.append(models_table(view))
    if view.colos is not None:
        parts.append(colos_table(view.colos))
        parts.append(Text(colos_summary(view.colos)))
    parts.extend(Text.from_markup("[yellow]note:[/] ") + Text(note) for note in view.notes)
    return Group(*parts)


def colos_summary(colos: Sequence[Mapping[str, Any]]) -> str:
    """Colos up (not drilled down) overall and per region (when the router reports regions)."""
    up = sum(1 for c in colos if c.get("healthy"))
    line = f"{up}/{len(colos)} colos up"
    regions: dict[str, list[bool]] = {}
    for colo in colos:
        if colo.get("region"):
            regions.setdefault(str(colo["region"]), []).append(bool(colo.get("healthy")))
    if regions:
        line += "; regions: " + ", ".join(
            f"{name} {sum(states)}/{len(states)}" for name, states in sorted(regions.items())
        )
    return line


def show_status(
    gather: Callable[[], StatusView],
    console: Console,
    *,
    watch_every_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    refreshes: int | None = None,
) -> int:
    """Print the screen once, or redraw it every `watch_every_s` until Ctrl-C (or `refreshes`
    redraws, for tests). Exit status 1 when the last screen could not read a source."""
    view = gather()
    if watch_every_s is None:
        console.print(status_screen(view))
        return exit_status(view)
    shown = 1
    with Live(status_screen(view), console=console, auto_refresh=False) as live:
        try:
            while refreshes is None or shown < refreshes:
                sleep(watch_every_s)
                view = gather()
                live.update(status_screen(view), refresh=True)
                shown += 1
        except KeyboardInterrupt:
            pass
    return exit_status(view)


def exit_status(view: StatusView) -> int:
    """1 when a source could not be read or Serve reports the application or a deployment
    unhealthy (the screen still shows the rest), else 0."""
    if view.failed or view.app is None:
        return 1
    statuses = {view.app.status} | {d.status for d in view.app.deployments.values()}
    return 1 if statuses & UNHEALTHY else 0
