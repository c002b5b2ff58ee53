"""`python -m benchmarks.run [--suite NAME ...] [--quick]`: run benchmark suites and print one JSON
document to stdout; progress goes to stderr, so `> bench.json` captures only the results."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from benchmarks.lib.config import add_served_arguments
from benchmarks.lib.goals import goals_table

log = logging.getLogger("benchmarks")

# The registry, one line per suite, named by what it measures: a module exposing
# `run(args) -> dict` (with a `goals` entry of benchmarks.lib.goals records), `NEEDS_RAY` and,
# optionally, `add_arguments(parser)`. Imported only when the command line is built.
SUITES: dict[str, str] = {
    "runtime": "benchmarks.runtime",
    "embeddings": "benchmarks.embeddings",
    "chat": "benchmarks.chat",
    "router": "benchmarks.router",
    "router_cpu": "benchmarks.router_cpu",
    "cache": "benchmarks.cache",
    "coldstart": "benchmarks.coldstart",
    "edge": "benchmarks.edge",
    "regions": "benchmarks.regions",
    "security": "benchmarks.security",
    "structured": "benchmarks.structured",
    "plan": "benchmarks.plan_scale",
    "prewarm": "benchmarks.prewarm",
    "atrest": "benchmarks.atrest",
    "front_door": "benchmarks.front_door",
    "at_size": "benchmarks.at_size",
    "gateway": "benchmarks.gateway",
}

LOG_FORMAT = "%(asctime)s %(name)s: %(message)s"
DEFAULT_MODELS_DIR = "models"
DEFAULT_THREADS = 2


def load_suites() -> dict[str, ModuleType]:
    return {name: importlib.import_module(module) for name, module in SUITES.items()}


def build_parser(suites: dict[str, ModuleType]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    parser.add_argument(
        "--suite",
        action="append",
        choices=sorted(suites),
        help="suite to run (repeatable); default: every suite",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke-sized run (seconds, not minutes)"
    )
    parser.add_argument(
        "--models-dir", default=DEFAULT_MODELS_DIR, help="where `make models` built the defaults"
    )
    parser.add_argument(
        "--provider",
        choices=("cpu", "auto", "cuda"),
        default="cpu",
        help="ONNX Runtime provider; cpu by default so ONNX and PyTorch compare like for like",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=DEFAULT_THREADS,
        help="compute threads for every engine measured (ONNX Runtime intra-op, torch)",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar (off anyway without a TTY)"
    )
    add_served_arguments(parser)
    for module in suites.values():
        add_arguments = getattr(module, "add_arguments", None)
        if add_arguments is not None:
            add_arguments(parser)
    return parser


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    """What the numbers depend on; load average because the cores may be shared."""
    import onnxruntime

    return {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "platform": platform.platform(),
        "processor": platform.machine(),
        "python": platform.python_version(),
        "onnxruntime": onnxruntime.__version__,
        "onnxruntime_providers": onnxruntime.get_available_providers(),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "numpy": _version("numpy"),
    }


def collect_goals(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every suite's `goals` under `<suite>.<goal>`, so one block says what was met."""
    return {
        f"{suite}.{name}": goal
        for suite, result in results.items()
        for name, goal in result.get("goals", {}).items()
    }


@contextlib.contextmanager
def suites_progress(total: int, *, enabled: bool) -> Iterator[Callable[[str], None]]:
    """Yields `started(name)`. On a terminal, a bar of suites done (stderr, with the log lines
    printed above it); elsewhere plain log lines only."""
    if not (enabled and sys.stderr.isatty()):
        logging.basicConfig(stream=sys.stderr, level=logging.INFO, format=LOG_FORMAT)
        yield lambda name: None
        return
    console = Console(stderr=True)
    logging.basicConfig(
        level=logging.INFO, format="%(name)s: %(message)s", handlers=[RichHandler(console=console)]
    )
    progress = Progress(
        TextColumn("bench {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )
    task = progress.add_task("", total=total)
    names: list[str] = []

    def started(name: str) -> None:
        if names:
            progress.advance(task)
        names.append(name)
        progress.update(task, description=name)

    with progress:
        yield started
        progress.update(task, completed=total, description="done")


def main(argv: Sequence[str] | None = None) -> int:
    suites = load_suites()
    args = build_parser(suites).parse_args(argv)
    selected = args.suite or list(suites)
    with suites_progress(len(selected), enabled=not args.no_progress) as started:
        return _run(args, suites, selected, started)


def _run(
    args: argparse.Namespace,
    suites: dict[str, ModuleType],
    selected: list[str],
    started_suite: Callable[[str], None],
) -> int:
    report: dict[str, Any] = {
        "machine": machine_info(),
        "command": " ".join(["python -m benchmarks.run", *sys.argv[1:]]),
        "args": {k: v for k, v in sorted(vars(args).items())},
    }
    results: dict[str, dict[str, Any]] = {}
    failed = False
    for name in selected:
        started_suite(name)
        log.info("suite %s: start%s", name, " (quick)" if args.quick else "")
        started = time.perf_counter()
        try:
            # Libraries that print would corrupt the JSON on stdout; their chatter goes to stderr.
            with contextlib.redirect_stdout(sys.stderr):
                results[name] = suites[name].run(args)
        except Exception as error:  # noqa: BLE001 - one broken suite must not lose the others
            log.exception("suite %s failed", name)
            results[name] = {"error": f"{type(error).__name__}: {error}"}
            failed = True
        results[name]["wall_s"] = round(time.perf_counter() - started, 2)
        log.info("suite %s: done in %.1fs", name, results[name]["wall_s"])
    report["suites"] = results
    goals = collect_goals(results)
    report["goals"] = goals
    report["all_goals_met"] = bool(goals) and all(goal["met"] for goal in goals.values())
    report["machine"]["load_average_1m_end"] = round(os.getloadavg()[0], 2)
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    # The same goals for a reader, on stderr beside the progress: the JSON stays clean on stdout.
    failed_suites = {name: r["error"] for name, r in results.items() if "error" in r}
    print(goals_table(goals, report["machine"], report["command"], failed_suites), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
