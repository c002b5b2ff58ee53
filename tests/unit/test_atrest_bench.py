"""The at-rest suite's parts that need no Ray: the two configs it runs (ours as shipped but for its
ports, folders and, on request, idle delays; Ray Serve's hello world with Serve's defaults), which
deployments must reach zero and by when, the embedding model's cold cycles (their pace and summary
against a fake clock and transport) and how its goals read."""

from __future__ import annotations

import argparse
import copy
import itertools
import json
from pathlib import Path

import httpx
import pytest
import yaml
from pydantic import ValidationError

from benchmarks.atrest import cold_cycles, serve_files
from benchmarks.atrest.config import AtRestBenchConfig, add_arguments
from benchmarks.atrest.suite import goals, ours_serve_config
from deployments.config import PROJECT_ROOT

SHIPPED = yaml.safe_load((PROJECT_ROOT / "serve_config.yaml").read_text())
MODELS = Path("/models")
DATA = Path("/tmp/state")
GOAL_NAMES = ("embedding_cold_start_p50_s", "embedding_cold_start_p90_s")


def test_ours_is_the_shipped_config_on_its_own_ports_and_folders() -> None:
    config = serve_files.ours(SHIPPED, MODELS, DATA, 18000, 18080, idle_delay_s=None)
    assert config["http_options"] == {"host": "127.0.0.1", "port": 18000}
    args = config["applications"][0]["args"]
    assert args["models_dir"] == "/models" and args["data_dir"] == "/tmp/state"
    # The routers' own port is off as shipped (HAProxy fronts 8000), and stays off in the copy.
    assert "listener" not in args.get("router", {})
    # Everything else as shipped: Serve's switches, the deployments and their delays.
    assert config["controller_options"] == SHIPPED["controller_options"]
    assert config["applications"][0]["deployments"] == SHIPPED["applications"][0]["deployments"]
    assert SHIPPED["http_options"]["port"] == 8000  # the copy changed, not the file


def test_a_shipped_router_listener_moves_to_the_suites_own_port() -> None:
    shipped = copy.deepcopy(SHIPPED)
    shipped["applications"][0]["args"].setdefault("router", {})["listener"] = {"enabled": True}
    config = serve_files.ours(shipped, MODELS, DATA, 18000, 18080, idle_delay_s=None)
    listener = config["applications"][0]["args"]["router"]["listener"]
    assert listener == {"enabled": True, "host": "127.0.0.1", "port": 18080}


def test_an_idle_delay_shortens_every_models_downscale_delays_and_nothing_else() -> None:
    config = serve_files.ours(SHIPPED, MODELS, DATA, 18000, 18080, idle_delay_s=3)
    scaled = [d for d in config["applications"][0]["deployments"] if "autoscaling_config" in d]
    assert len(scaled) == 12  # four models in three regions
    for deployment in scaled:
        scaling = deployment["autoscaling_config"]
        assert scaling["downscale_delay_s"] == scaling["downscale_to_zero_delay_s"] == 3
        assert scaling["min_replicas"] == 0
    assert serve_files.longest_idle_delay_s(config) == 3


def test_the_models_are_the_deployments_that_scale_to_zero() -> None:
    config = serve_files.ours(SHIPPED, MODELS, DATA, 18000, 18080, idle_delay_s=None)
    (models,) = serve_files.scale_to_zero_deployments(config).values()
    assert "router" not in models and {"glm-eu", "kimi-ap", "moderation-us"} <= set(models)
    # As shipped, the slowest to reach zero waits its downscale_to_zero_delay_s (5 minutes).
    assert serve_files.longest_idle_delay_s(config) == 300


def test_the_hello_world_runs_with_serves_defaults_and_no_model() -> None:
    config = serve_files.hello_world(18001)
    assert "controller_options" not in config
    assert config["http_options"]["port"] == 18001
    assert serve_files.scale_to_zero_deployments(config) == {"hello": []}
    assert serve_files.longest_idle_delay_s(config) == 0


def _side(share: float, left: dict[str, int]) -> dict:
    return {"cpu_share_of_one_core": share, "replicas_left_at_rest": left}


def test_the_goals_judge_the_difference_and_the_replicas_left() -> None:
    met = goals(_side(0.12, {}), _side(0.09, {}), 0.03)
    assert met["cpu_at_rest_over_hello_world"]["met"] is True
    assert met["cpu_at_rest_over_hello_world"]["details"] == {"ours": 0.12, "hello_world": 0.09}
    assert met["model_replicas_at_rest"]["value"] == 0 and met["model_replicas_at_rest"]["met"]
    missed = goals(_side(0.33, {"glm-eu": 1}), _side(0.09, {}), 0.24)
    assert missed["cpu_at_rest_over_hello_world"]["met"] is False
    assert missed["model_replicas_at_rest"]["value"] == 1
    assert missed["model_replicas_at_rest"]["met"] is False


def _idle_delays(config: dict) -> dict[str, tuple[float, float]]:
    return {
        d["name"]: (s["downscale_delay_s"], s["downscale_to_zero_delay_s"])
        for d in config["applications"][0]["deployments"]
        if (s := d.get("autoscaling_config"))
    }


def test_the_copy_sets_the_embedding_pools_idle_delays_for_the_cold_cycles() -> None:
    shipped = _idle_delays(SHIPPED)
    for idle_delay_s in (None, 3.0):
        config = AtRestBenchConfig(models_dir=MODELS, idle_delay_s=idle_delay_s)
        copy = ours_serve_config(config, SHIPPED, DATA)
        for name, delays in _idle_delays(copy).items():
            others = shipped[name] if idle_delay_s is None else (3.0, 3.0)
            assert delays == ((5.0, 5.0) if name.startswith("embedding-") else others), name
    assert len(serve_files.model_deployments(copy, "embedding")) == 3  # one pool a region


def _parsed(*argv: str, quick: bool = False) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(argv)
    args.quick, args.models_dir = quick, str(MODELS)
    return args


def test_the_cold_cycle_options_their_flags_and_the_quick_form() -> None:
    default = AtRestBenchConfig.from_args(_parsed())
    assert (default.cold_cycles, default.cold_interval_s, default.cold_idle_delay_s) == (10, 10, 5)
    assert AtRestBenchConfig.from_args(_parsed(quick=True)).cold_cycles == 2
    flagged = AtRestBenchConfig.from_args(
        _parsed(
            "--atrest-cold-cycles",
            "3",
            "--atrest-cold-interval-s",
            "8",
            "--atrest-cold-idle-delay-s",
            "4",
            quick=True,
        )
    )
    assert (flagged.cold_cycles, flagged.cold_interval_s, flagged.cold_idle_delay_s) == (3, 8, 4)
    with pytest.raises(ValidationError, match="reach zero between cycles"):
        AtRestBenchConfig(models_dir=MODELS, cold_idle_delay_s=10, cold_interval_s=10)
    with pytest.raises(ValidationError):
        AtRestBenchConfig(models_dir=MODELS, cold_cycles=0)


class FakePlatform:
    """A clock that only moves when told, and an embedding model behind a fake transport: each
    request takes the next of `latencies_s`, and the pools are at zero `zero_after_s` after the
    latest request was sent."""

    def __init__(self, latencies_s: list[float], zero_after_s: float, status: int = 200):
        self.time = 1000.0
        self.latencies_s = iter(latencies_s)
        self.zero_after_s = zero_after_s
        self.status = status
        self.last_sent = self.time
        self.sent_at: list[float] = []
        self.inputs: list[str] = []

    def now(self) -> float:
        return self.time

    def sleep(self, seconds: float) -> None:
        self.time += seconds

    def at_zero(self) -> bool:
        return self.time - self.last_sent >= self.zero_after_s

    def handle(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/embeddings"
        self.last_sent = self.time
        self.sent_at.append(self.time)
        self.inputs.append(json.loads(request.content)["input"])
        latency_s = next(self.latencies_s)
        self.time += latency_s
        headers = {"x-edge-cold-start": "1", "x-edge-cold-start-ms": f"{latency_s * 900:.0f}"}
        return httpx.Response(self.status, headers=headers, json={"data": []})

    def cycles(self, count: int) -> dict:
        client = httpx.Client(transport=httpx.MockTransport(self.handle))
        part = cold_cycles.ColdCycles(client, "http://edge", self.at_zero, self, "run1")
        # Zero within 5 + 25 s of a request, or that cycle sends nothing.
        config = AtRestBenchConfig(models_dir=MODELS, cold_cycles=count, zero_margin_s=25)
        return part.run(config)


def test_each_cycle_waits_for_zero_then_sends_a_pace_after_the_previous_request() -> None:
    platform = FakePlatform([2.0, 0.4, 0.9, 0.45, 0.5], zero_after_s=6.0)
    summary = platform.cycles(4)
    # The first request (the rested platform's) sets the pace; the cycles follow 10 s apart.
    gaps = [later - earlier for earlier, later in itertools.pairwise(platform.sent_at)]
    assert gaps == [10.0] * 4
    assert len(set(platform.inputs)) == 5  # unique inputs: no cache hit
    assert summary["rested_request"]["seconds"] == 2.0  # reported, not among the cycles
    cycles = summary["cycles"]
    assert [c["answered_s"] for c in cycles] == [0.4, 0.9, 0.45, 0.5]
    assert cycles[1]["answer"]["cold_start"] == "1"
    assert cycles[1]["answer"]["cold_start_ms"] == 810.0
    assert cycles[0]["zero_after_s"] == 6.0 and cycles[0]["since_previous_request_s"] == 10.0
    assert summary["p50_s"] == 0.475 and summary["p90_s"] == 0.78  # numpy's linear percentiles
    met = cold_cycles.goals(summary)
    assert met["embedding_cold_start_p50_s"]["met"] is True
    assert met["embedding_cold_start_p90_s"]["met"] is False  # the slow mode is the tail
    assert met["embedding_cold_start_p90_s"]["details"]["per_cycle_s"] == [0.4, 0.9, 0.45, 0.5]


def test_pools_slower_to_zero_than_the_pace_are_asked_at_once_without_more_rest() -> None:
    platform = FakePlatform([0.3] * 3, zero_after_s=12.2)
    summary = platform.cycles(2)
    # Polled from the answer (0.3 s) every 0.5 s: zero seen at 12.3 s, the request leaves then.
    assert [c["since_previous_request_s"] for c in summary["cycles"]] == [12.3, 12.3]
    assert all(cold_cycles.goals(summary)[name]["met"] for name in GOAL_NAMES)


def test_a_cycle_never_at_zero_sends_nothing_and_leaves_the_goals_unmeasured() -> None:
    platform = FakePlatform([0.3], zero_after_s=60.0)
    summary = platform.cycles(2)
    assert len(platform.sent_at) == 1  # the rested request only
    assert [c["answer"] for c in summary["cycles"]] == [None, None]
    for record in cold_cycles.goals(summary).values():
        assert record["value"] is None and record["met"] is False
        assert record["missing"] == "0 of 2 cycles answered from zero"


def test_an_unanswered_cycle_is_a_miss_not_a_dropped_sample() -> None:
    platform = FakePlatform([0.3] * 3, zero_after_s=6.0, status=503)
    summary = platform.cycles(2)
    assert summary["cycles"][0]["answer"]["status"] == 503
    assert summary["answered"] == 0 and summary["p50_s"] is None
    assert not any(record["met"] for record in cold_cycles.goals(summary).values())


def test_a_failed_part_states_its_goals_with_its_error() -> None:
    met = cold_cycles.goals({"error": "ConnectError('refused')"})
    assert set(met) == set(GOAL_NAMES)
    assert all(
        r["value"] is None and r["missing"] == "ConnectError('refused')" for r in met.values()
    )
