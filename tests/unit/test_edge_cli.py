"""The `edge` command: its parser, exit codes, the live status table and fault drills, against
fake HTTP servers (httpx.MockTransport); no Ray, no router."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console

from edgectl.cli import PASS_THROUGH, build_parser, main
from edgectl.drill import parse_duration_s

REPO = Path(__file__).resolve().parents[2]
ADMIN_KEY = "drill-key"
SERVE_APPLICATIONS = json.loads(
    (Path(__file__).parent / "data" / "serve_applications.json").read_text()
)
COLOS = [
    {"id": "FRA", "region": "eu", "city": "Frankfurt", "healthy": True, "faults": []},
    {"id": "AMS", "region": "eu", "city": "Amsterdam", "healthy": True, "faults": []},
    {"id": "NRT", "region": "asia", "city": "Tokyo", "healthy": True, "faults": []},
]


class FakeRouter:
    """/admin/colos and its faults, as the router answers them; records every call."""

    def __init__(self, colos: list[dict[str, Any]] = COLOS):
        self.colos = colos
        self.calls: list[tuple[str, str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.headers.get("authorization") != f"Bearer {ADMIN_KEY}":
            return httpx.Response(401, json={"error": {"message": "bad admin key"}})
        body = json.loads(request.content) if request.content else None
        self.calls.append((request.method, request.url.path, body))
        if request.url.path == "/admin/colos":
            return httpx.Response(200, json=self.colos)
        colo = request.url.path.split("/")[3]
        if colo not in {c["id"] for c in self.colos}:
            return httpx.Response(404, json={"error": {"message": f"no colo {colo}"}})
        return httpx.Response(200, json={"id": colo})


def run(argv: list[str], transport: httpx.BaseTransport, **kwargs: Any) -> tuple[int, str]:
    console = Console(record=True, width=160, color_system=None)
    code = main(argv, transport=transport, console=console, **kwargs)
    return code, console.export_text()


def drill(*argv: str, router: FakeRouter, key: str = ADMIN_KEY) -> tuple[int, str]:
    return run(["drill", *argv, "--url", "http://router.test", "--admin-key", key],
               httpx.MockTransport(router))  # fmt: skip


# ---- parsing and help ---------------------------------------------------------------------


def test_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    for command in ("check", "status", "drill", "loadtest", "plan", "export", "k8s"):
        assert command in text
    assert set(PASS_THROUGH) == {"check", "loadtest", "plan", "export", "k8s"}


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["nonsense"],
        ["drill", "explode", "FRA"],
        ["drill", "down"],
        ["drill", "down", "FRA", "--for", "soon"],
        ["status", "--watch", "often"],
        ["status", "--bogus"],
    ],
)
def test_usage_mistakes_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert "usage: edge" in capsys.readouterr().err


def test_durations_read_as_an_operator_writes_them() -> None:
    assert [parse_duration_s(t) for t in ("30", "30s", "2m", "1.5h", " 45 S ")] == [
        30.0, 30.0, 120.0, 5400.0, 45.0,
    ]  # fmt: skip
    for bad in ("", "0s", "-5s", "5 days", "m"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration_s(bad)
    args = build_parser().parse_args(["status", "--watch"])
    assert args.watch == 2.0 and build_parser().parse_args(["status"]).watch is None


def test_pass_through_commands_get_their_own_help(capsys: pytest.CaptureFixture[str]) -> None:
    for command, flag in (("loadtest", "--scenario"), ("k8s", "render"), ("export", "defaults"),
                          ("check", "config")):  # fmt: skip
        with pytest.raises(SystemExit) as exited:
            main([command, "--help"])
        assert exited.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith(f"usage: edge {command}") and flag in out


def test_check_exits_1_on_a_broken_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["check", str(REPO / "serve_config.yaml")]) == 0
    assert "serve_config.yaml: OK" in capsys.readouterr().out
    broken = tmp_path / "serve_config.yaml"
    broken.write_text("applications:\n  - name: edge\n    import_path: 42\n    route_prefix: 7\n")
    assert main(["check", str(broken)]) == 1
    assert "applications" in capsys.readouterr().out


def test_config_module_reads_help_as_help() -> None:
    done = subprocess.run([sys.executable, "-m", "deployments.serve_file", "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and done.stdout.startswith(
        "usage: python -m deployments.serve_file"
    )


# ---- status ----------------------------------------------------------------------------------


def status_server(states: list[dict[str, Any]]) -> tuple[httpx.MockTransport, list[str]]:
    """Ray's dashboard answering `states` in turn, and a router; logs each request's path."""
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.url.host}{request.url.path}")
        if request.url.host == "dash.test":
            return httpx.Response(200, json=states[min(len(seen_dash(seen)) - 1, len(states) - 1)])
        if request.url.path == "/readyz":
            return httpx.Response(200, json={"models": {"glm": {"in_flight": 1}}})
        return httpx.Response(200, json=COLOS)

    return httpx.MockTransport(handle), seen


def seen_dash(seen: list[str]) -> list[str]:
    return [path for path in seen if path.startswith("dash.test")]


def with_glm(replica_states: list[str], target: int) -> dict[str, Any]:
    state = copy.deepcopy(SERVE_APPLICATIONS)
    glm = state["applications"]["edge"]["deployments"]["glm"]
    glm["target_num_replicas"] = target
    glm["replicas"] = [{**glm["replicas"][0], "state": s} for s in replica_states]
    return state


STATUS = ["status", "--url", "http://router.test", "--dashboard", "http://dash.test",
          "--admin-key", ADMIN_KEY]  # fmt: skip


def test_status_watch_redraws_a_cold_start_with_one_dashboard_call_each() -> None:
    states = [with_glm([], 0), with_glm(["STARTING"], 1), with_glm(["RUNNING"], 1)]
    transport, seen = status_server(states)
    naps: list[float] = []
    code, text = run([*STATUS, "--watch", "0.5"], transport, sleep=naps.append, refreshes=3)
    assert code == 0 and naps == [0.5, 0.5]
    assert seen_dash(seen) == ["dash.test/api/serve/applications/"] * 3
    # The last screen stays: glm went 0 -> 1 running replica.
    glm = next(line for line in text.splitlines() if line.strip("│ ").startswith("glm"))
    assert "1 / 1" in glm and "RUNNING 1" in glm
    assert "3/3 colos up" in text and "regions: asia 1/1, eu 2/2" in text


def test_status_exits_1_when_a_deployment_is_unhealthy_or_the_dashboard_is_down() -> None:
    sick = copy.deepcopy(SERVE_APPLICATIONS)
    sick["applications"]["edge"]["deployments"]["kimi"]["status"] = "UNHEALTHY"
    code, _ = run(STATUS, status_server([sick])[0])
    assert code == 1

    def dashboard_down(request: httpx.Request) -> httpx.Response:
        if request.url.host == "dash.test":
            return httpx.Response(503, text="starting")
        return httpx.Response(200, json={"models": {}} if request.url.path == "/readyz" else [])

    code, text = run(STATUS, httpx.MockTransport(dashboard_down))
    assert code == 1 and "replicas unknown: Ray dashboard at http://dash.test: HTTP 503" in text


# ---- drills ----------------------------------------------------------------------------------


def test_drill_down_for_a_while_sets_a_self_clearing_fault() -> None:
    router = FakeRouter()
    code, text = drill("down", "fra", "--for", "30s", router=router)
    assert code == 0
    assert router.calls == [
        ("GET", "/admin/colos", None),
        ("POST", "/admin/colos/FRA/faults", {"down": True, "duration_s": 30.0}),
    ]
    assert "FRA: down for 30 s (clears itself)" in text


def test_drill_on_a_region_reaches_each_of_its_colos() -> None:
    router = FakeRouter()
    assert drill("latency", "eu", "--latency-ms", "250", router=router)[0] == 0
    assert router.calls[1:] == [
        ("POST", "/admin/colos/FRA/faults", {"added_latency_ms": 250.0}),
        ("POST", "/admin/colos/AMS/faults", {"added_latency_ms": 250.0}),
    ]
    router.calls.clear()
    code, text = drill("clear", "EU", router=router)
    assert code == 0 and "cleared every fault at FRA, AMS" in text
    assert [c[:2] for c in router.calls[1:]] == [
        ("DELETE", "/admin/colos/FRA/faults"),
        ("DELETE", "/admin/colos/AMS/faults"),
    ]


def test_drill_exit_codes_say_whose_mistake_it_was() -> None:
    router = FakeRouter()
    code, text = drill("down", "XYZ", router=router)
    assert code == 2 and "no colo or region 'XYZ'" in text and "regions asia, eu" in text
    code, text = drill("errors", "FRA", "--error-rate", "1.5", router=router)
    assert code == 2 and "error_rate" in text
    code, text = drill("down", "FRA", router=router, key="wrong")
    assert code == 1 and "refused the admin key" in text
    code, text = drill("down", "FRA", router=router, key="")
    assert code == 2 and "EDGE_ADMIN_KEY" in text
    assert not [c for c in router.calls if c[0] != "GET"]  # nothing was set by any of them


def test_plan_passes_through_to_the_planner(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["plan", "--help"])
    assert exited.value.code == 0
    assert "usage: edge plan" in capsys.readouterr().out
