"""`edge`: the operator's one command. Each subcommand wraps a tool of this repository; `edge
<command> --help` says more. Exit status: 0 ok, 1 a check failed or the platform is unhealthy,
2 the command line was wrong."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence

try:
    import httpx
    from rich.console import Console
except ImportError as missing:  # `edge` is installed with the package; its libraries with `tools`
    raise SystemExit(
        f"edge needs the `tools` extra ({missing}): pip install -e '.[tools]'"
    ) from None

from edge_sim.clock import Clock
from edgectl import drill, gateway
from edgectl.gateway import add_keys_parser
from edgectl.serve_state import DEFAULT_APP, ServeDashboard, default_dashboard

OK, FAILED, USAGE = 0, 1, 2
DEFAULT_ROUTER = "http://127.0.0.1:8000"
WATCH_EVERY_S = 2.0
# Wrapped tools with their own parsers: `edge <name> ...` hands them everything after the name.
PASS_THROUGH = {
    "check": "check a Serve config file before `serve deploy` (deployments.serve_file)",
    "loadtest": "open-loop load test with a report (python -m edgectl.loadtest)",
    "plan": "capacity planner: replay a trace offline (python -m edgectl.plan)",
    "export": "build model directories from checkpoints (python -m deployments.export)",
    "k8s": "render or --check the RayService manifest (python -m deployments.k8s)",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edge",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # The order of `edge --help`: the pre-deploy check first, then the live commands.
    commands.add_parser("check", help=PASS_THROUGH["check"], add_help=False)

    status = commands.add_parser(
        "status", help="replicas, queues, cold starts, colo and region health",
        description="One screen of the platform: replicas per model (Ray dashboard REST API), "
        "queue and last cold start (router /readyz), colos (router /admin/colos).",
    )  # fmt: skip
    _router_options(status)
    status.add_argument(
        "--dashboard",
        default=default_dashboard(),
        help="Ray dashboard (default: $RAY_DASHBOARD_ADDRESS or %(default)s); token from "
        "RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token",
    )
    status.add_argument("--app", default=DEFAULT_APP, help="Serve application (%(default)s)")
    status.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=WATCH_EVERY_S,
        metavar="SECONDS",
        help=f"redraw every SECONDS (default {WATCH_EVERY_S:g}) until Ctrl-C",
    )

    fault = commands.add_parser(
        "drill", help="fault drills: take a colo or region down, slow it, fail requests",
        description="Set or clear faults through the router's admin API (key: EDGE_ADMIN_KEY). "
        "A region means every colo in it.",
    )  # fmt: skip
    fault.add_argument("action", choices=("down", "latency", "errors", "clear"))
    fault.add_argument("target", metavar="COLO_OR_REGION", help="e.g. FRA, or a region name")
    fault.add_argument(
        "--for",
        dest="for_s",
        type=_duration,
        metavar="DURATION",
        help="the fault clears itself after this long (30s, 2m, 1h); default: until cleared",
    )
    fault.add_argument("--latency-ms", type=float, default=300.0, help="latency: added ms")
    fault.add_argument("--error-rate", type=float, default=0.5, help="errors: share failed")
    _router_options(fault)

    add_keys_parser(commands, _router_options, _duration)

    for name, summary in PASS_THROUGH.items():
        if name != "check":
            commands.add_parser(name, help=summary, add_help=False)
    return parser


def _router_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=os.environ.get("EDGE_ROUTER_URL", DEFAULT_ROUTER),
        help="the router (default: $EDGE_ROUTER_URL or %(default)s)",
    )
    parser.add_argument(
        "--admin-key",
        default=os.environ.get("EDGE_ADMIN_KEY"),
        help="bearer key of /admin (default: $EDGE_ADMIN_KEY)",
    )


def _duration(text: str) -> float:
    try:
        return drill.parse_duration_s(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def main(
    argv: Sequence[str] | None = None,
    *,
    transport: httpx.BaseTransport | None = None,
    console: Console | None = None,
    sleep: Callable[[float], None] = time.sleep,
    refreshes: int | None = None,
    wall_clock: Clock = time.time,
) -> int:
    """The keyword arguments let tests drive every HTTP call, the clock and the watch loop."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args, rest = parser.parse_known_args(argv)
    if args.command in PASS_THROUGH:
        return _pass_through(args.command, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    console = console or Console()
    if args.command == "status":
        return _status(args, console, transport, sleep, refreshes, wall_clock)
    if args.command in ("keys", "usage"):
        return _gateway(args, console, transport, wall_clock)
    return _drill(args, console, transport)


def _pass_through(command: str, rest: list[str]) -> int:
    if command == "loadtest":
        from edgectl.loadtest.cli import main as loadtest

        if rest[:1] == ["chaos"]:  # it starts and kills a cluster of its own
            from edgectl.loadtest.chaos import main as chaos

            return chaos(rest[1:])

        # `edge loadtest steady --rate 5` reads better than `--scenario steady`.
        if rest and not rest[0].startswith("-"):
            rest = ["--scenario", *rest]
        return loadtest(rest, prog="edge loadtest")
    if command == "plan":
        from edgectl.plan.cli import main as plan

        return plan(rest, prog="edge plan")
    if command == "check":
        from deployments.serve_file import main as check

        return check(rest, prog="edge check")
    if command == "export":
        from deployments.export.__main__ import main as export

        return export(rest, prog="edge export")
    from deployments.k8s import main as k8s

    return k8s(rest, prog="edge k8s")


def _status(
    args: argparse.Namespace,
    console: Console,
    transport: httpx.BaseTransport | None,
    sleep: Callable[[float], None],
    refreshes: int | None,
    wall_clock: Clock,
) -> int:
    from edgectl.status import gather_status, show_status

    dashboard = ServeDashboard(args.dashboard, app=args.app, transport=transport)
    try:
        code = show_status(
            lambda: gather_status(
                args.url, args.admin_key, dashboard, transport=transport, wall_clock=wall_clock
            ),
            console,
            watch_every_s=args.watch,
            sleep=sleep,
            refreshes=refreshes,
        )
    finally:
        dashboard.close()
    return code


def _admin_client(
    args: argparse.Namespace, transport: httpx.BaseTransport | None, timeout_s: float
) -> httpx.Client:
    """The router's admin API with the admin key (--url, --admin-key)."""
    return httpx.Client(
        base_url=args.url,
        transport=transport,
        timeout=timeout_s,
        trust_env=False,
        headers={"authorization": f"Bearer {args.admin_key}"},
    )


def _gateway(
    args: argparse.Namespace,
    console: Console,
    transport: httpx.BaseTransport | None,
    wall_clock: Clock,
) -> int:
    if not args.admin_key:
        console.print(f"edge {args.command}: set EDGE_ADMIN_KEY or pass --admin-key")
        return USAGE
    with _admin_client(args, transport, gateway.HTTP_TIMEOUT_S) as client:
        try:
            if args.command == "keys":
                gateway.run_keys(args, client, console, wall_clock)
            else:
                gateway.run_usage(args, client, console, wall_clock)
        except gateway.AdminError as error:
            console.print(f"edge {args.command}: {error}", highlight=False)
            return FAILED
    return OK


def _drill(
    args: argparse.Namespace, console: Console, transport: httpx.BaseTransport | None
) -> int:
    if not args.admin_key:
        console.print("edge drill: set EDGE_ADMIN_KEY or pass --admin-key", highlight=False)
        return USAGE
    try:
        fault = None
        if args.action != "clear":
            fault = drill.fault_for(
                args.action, latency_ms=args.latency_ms, error_rate=args.error_rate,
                for_s=args.for_s,
            )  # fmt: skip
    except ValueError as error:  # pydantic: e.g. an error rate above 1
        console.print(f"edge drill: {error}", highlight=False)
        return USAGE
    with _admin_client(args, transport, drill.HTTP_TIMEOUT_S) as client:
        try:
            result = drill.run_drill(client, args.action, args.target, fault)
        except drill.UnknownTargetError as error:
            console.print(f"edge drill: {error}", highlight=False)
            return USAGE
        except drill.DrillError as error:
            console.print(f"edge drill: {error}", highlight=False)
            return FAILED
    console.print(drill.describe(result), highlight=False)
    return OK


if __name__ == "__main__":
    sys.exit(main())
