"""The planner at scale, quick: 100k requests of a day over 300 colos and 20 regions (the full
day of ten million, with its time and memory, is benchmarks/plan_scale.py)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from benchmarks.plan_scale import MODELS, SHIPPED
from edge_sim.plan.simulator import SimSettings, Simulator
from edge_sim.plan.summary import totals
from edge_sim.plan.trace import TraceSpec, generate
from edge_sim.plan.world import synthetic_world
from edgectl.plan.cli import main as plan_main
from edgectl.plan.cli import parse_policy
from edgectl.plan.config import load_serve_config


def test_quick_day_over_300_colos_and_20_regions_accounts_for_every_request():
    world = synthetic_world(300, 20, seed=0)
    spec = SHIPPED  # what the scale benchmark plans with
    trace = generate(TraceSpec(requests=100_000, model_shares=MODELS, seed=1), world.origins)
    result = Simulator(world, dict.fromkeys(MODELS, spec), SimSettings()).run(trace)
    figures = totals(result)
    assert abs(figures["arrivals"] - 100_000) < 2_000
    assert figures["served"] + figures["sheds"] == figures["arrivals"]
    assert len(result.regions) == 20 and len(result.pools) == 80
    # Every region serves; routing decisions are reused while the snapshot holds.
    assert all(result.requests_timeline[i].sum() > 0 for i in range(20))
    assert figures["route_cache_hits"] > 0
    assert 0 < figures["cold_starts"] < figures["served"]
    # Per-request outcomes are folded into counters: nothing grows with the request count.
    assert all(len(stats.histogram) == len(result.pools[("glm", "ams")].histogram)
               for stats in result.pools.values())  # fmt: skip


def test_edge_plan_help_shows_a_worked_example(capsys):
    try:
        plan_main(["--help"])
    except SystemExit as done:
        assert done.code == 0
    text = capsys.readouterr().out
    assert "worked example" in text and "edge plan --colos 300 --regions 20" in text


def test_edge_plan_writes_a_report_and_refuses_an_unknown_region(tmp_path: Path, capsys):
    out = tmp_path / "plan"
    code = plan_main(
        ["--requests", "3000", "--hours", "6", "--policy", "config", "--policy", "min:1",
         "--outage", "eu:3600:600", "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    report = (out / "report.md").read_text()
    assert "| eu | glm |" in report and "min 1" in report
    assert (out / "replicas_over_time.png").stat().st_size > 1000
    assert plan_main(["--outage", "mars:1:1", "--out", str(out)]) == 2
    assert "unknown regions ['mars']" in capsys.readouterr().err


def test_edge_plan_names_the_trace_sources_it_knows(tmp_path: Path, capsys):
    assert plan_main(["--trace", "gateway:db", "--out", str(tmp_path)]) == 2
    assert "diurnal, follow-the-sun, flat or records:PATH" in capsys.readouterr().err
    assert plan_main(["--trace", f"records:{tmp_path / 'none.csv'}", "--out", str(tmp_path)]) == 2
    assert "none.csv" in capsys.readouterr().err


def test_edge_plan_takes_colo_drills_as_the_admin_api_writes_them(tmp_path: Path, capsys):
    out = tmp_path / "drill"
    drill = 'FRA:{"down": true, "start_after_s": 3600, "duration_s": 1800}'
    assert plan_main(["--requests", "2000", "--hours", "3", "--colo-fault", drill,
                      "--out", str(out)]) == 0  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    assert summary["params"]["colo_faults"]["FRA"][0]["duration_s"] == 1800
    assert plan_main(["--colo-fault", 'XXX:{"down": true}', "--out", str(out)]) == 2
    assert "--colo-fault: unknown colos ['XXX']" in capsys.readouterr().err
    assert plan_main(["--colo-fault", 'FRA:{"slow": 1}', "--out", str(out)]) == 2
    assert "slow: Extra inputs are not permitted" in capsys.readouterr().err


def test_edge_plan_takes_pre_warming_settings_from_the_config(tmp_path: Path):
    config = yaml.safe_load((Path(__file__).parents[2] / "serve_config.yaml").read_text())
    prewarm = {"enabled": True, "lookahead_s": 900, "min_expected": 2}
    config["applications"][0]["args"]["edge"]["prewarm"] = prewarm
    path = tmp_path / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    plan_config = load_serve_config(path)
    as_deployed = parse_policy("config", plan_config)
    assert as_deployed.name == "config (pre-warming)" and as_deployed.floor is not None
    assert "expects >= 2 requests in 900s" in parse_policy("predictive", plan_config).description
    assert "in 300s" in parse_policy("predictive:2:300", plan_config).description
    shipped = load_serve_config(Path(__file__).parents[2] / "serve_config.yaml")
    assert parse_policy("config", shipped).floor is None  # off as shipped: scale-to-zero alone
