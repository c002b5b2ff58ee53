"""The capacity planner (edge_sim/plan, edge plan): seeded, no Ray, no cluster."""

from __future__ import annotations

import csv
import random
from pathlib import Path

import numpy as np
import pytest

from edge_sim.config import EdgeConfig
from edge_sim.faults import ColoFault
from edge_sim.geo import ClientLocation
from edge_sim.plan.autoscaler import AutoscalingSpec, PoolSpec, ServeAutoscaler
from edge_sim.plan.policies import compare, predictive, scale_to_zero
from edge_sim.plan.replay import ReplayedRequest, replay_trace
from edge_sim.plan.simulator import RegionOutage, SimSettings, Simulator
from edge_sim.plan.stats import percentile_ms
from edge_sim.plan.summary import totals
from edge_sim.plan.trace import Trace, TraceChunk, TraceSpec, generate
from edge_sim.plan.world import Origin, World, synthetic_world
from edge_sim.prewarm import PredictivePrewarm, PrewarmConfig
from edgectl.loadtest.records import EdgeHeaders, RequestRecord, write_csv
from edgectl.plan.sources.loadtest import read_loadtest_records

THREE_REGIONS = {
    "eu": {"lat": 50.1109, "lon": 8.6821},
    "us": {"lat": 39.0438, "lon": -77.4874},
    "ap": {"lat": 1.3521, "lon": 103.8198},
}
FRANKFURT = Origin("frankfurt", 50.11, 8.68)


def _world(origins=(FRANKFURT,)) -> World:
    return World(EdgeConfig.model_validate({"regions": THREE_REGIONS}), list(origins))


def _spec(**autoscaling) -> PoolSpec:
    fields = dict(
        min_replicas=0, initial_replicas=1, max_replicas=2, target_ongoing_requests=8,
        upscale_delay_s=2, downscale_delay_s=120, downscale_to_zero_delay_s=300,
        look_back_period_s=2, metrics_interval_s=0.5,
    )  # fmt: skip
    fields.update(autoscaling)
    return PoolSpec(
        autoscaling_config=AutoscalingSpec(**fields),
        max_ongoing_requests=16,
        max_queued_requests=64,
    )


def _poisson(world: World, rate_rps: float, duration_s: float, seed: int = 1) -> Trace:
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0, duration_s, rng.poisson(rate_rps * duration_s)))
    chunk = TraceChunk(
        0.0,
        duration_s,
        t,
        rng.integers(0, len(world.origins), len(t)).astype(np.int32),
        np.zeros(len(t), dtype=np.int16),
    )
    return Trace(world.origins, ("glm",), duration_s, [chunk])


def test_autoscaler_delay_and_scaling_match_ray_serve():
    """The port against Ray Serve's own functions, on random decisions (no Ray started)."""
    from ray.serve.autoscaling_policy import _apply_delay_logic, _apply_scaling_factors
    from ray.serve.config import AutoscalingConfig

    spec = AutoscalingSpec(
        min_replicas=0, max_replicas=5, upscale_delay_s=2, downscale_delay_s=10,
        downscale_to_zero_delay_s=30,
    )  # fmt: skip
    ray_config = AutoscalingConfig(**spec.model_dump(exclude_none=True))
    ours = ServeAutoscaler(spec)
    rng = random.Random(3)
    state: dict = {}
    target = 1
    changes = 0
    for step in range(4000):
        now = step * 0.5
        # Runs of the same desire, so delays can elapse.
        desired = rng.choice([0, 0, 1, 1, 2, 3, 5]) if step % 25 == 0 else desired  # noqa: F821
        theirs, state = _apply_delay_logic(desired, target, ray_config, state, _now=now)
        assert ours._delayed(desired, target, now) == theirs, step
        changes += theirs != target
        target = theirs
        running = rng.randint(1, 5)
        wanted = rng.uniform(0, 6)
        assert ours._scaled(wanted, running) == _apply_scaling_factors(wanted, running, ray_config)
    assert changes > 20  # the sequence exercised real decisions


def test_idle_pool_scales_to_zero_after_the_delay_and_a_request_wakes_it():
    world = _world()
    times = np.array([10.0, 1000.0])
    trace = Trace(
        world.origins,
        ("glm",),
        1400.0,
        [TraceChunk(0, 1400, times, np.zeros(2, np.int32), np.zeros(2, np.int16))],
    )
    settings = SimSettings(service_sigma=0, cold_start_s={"glm": 0.4})
    result = Simulator(world, {"glm": _spec(initial_replicas=0)}, settings).run(trace)
    eu = result.pools[("glm", "eu")]
    assert eu.requests == 2 and eu.cold == 2  # at zero both times
    assert eu.scale_from_zero == 2
    # Up 0.4 s after each request, down once downscale_to_zero_delay_s has held.
    running = [(round(t, 1), r) for t, r, _ in eu.timeline]
    assert (10.4, 1) in running
    down = [t for t, r, target in eu.timeline if r == 0 and target == 0 and 10 < t < 1000]
    assert down and 310 <= down[0] <= 312
    assert 600 < eu.replica_s < 620  # two stretches of ~300 s


def test_region_outage_moves_traffic_to_the_next_region_and_back():
    world = _world()
    trace = _poisson(world, 5.0, 600.0)
    outage = RegionOutage(region="eu", start_s=200, duration_s=100)
    specs = {"glm": _spec(min_replicas=1, initial_replicas=1)}
    sim = Simulator(world, specs, SimSettings(timeline_s=50), outages=[outage])
    result = sim.run(trace)
    served = result.requests_timeline  # regions x 50 s buckets
    eu, us, ap = (result.regions.index(r) for r in ("eu", "us", "ap"))
    assert served[eu, :4].sum() > 0.99 * served[:, :4].sum()  # before: all at home
    during = served[:, 4:6].sum()
    assert served[eu, 4:6].sum() == 0 and served[us, 4:6].sum() + served[ap, 4:6].sum() == during
    assert served[eu, 8:].sum() > 0.9 * served[:, 8:].sum()  # after: home again
    assert sum(result.sheds.values()) == 0
    failed = result.failed_attempts[("glm", "eu")]
    assert 3 <= failed < 0.2 * during  # ejected after a few failures, probed now and then


def test_colo_drills_act_as_in_the_router_down_slowed_failing_and_windowed():
    world = _world()
    specs = {"glm": _spec(min_replicas=1, initial_replicas=1)}
    down, slow = ColoFault(down=True), ColoFault(added_latency_ms=400)

    def run(faults=None, **settings):
        trace = _poisson(world, 5.0, 600.0)
        sim = Simulator(world, specs, SimSettings(timeline_s=50, **settings), colo_faults=faults)
        return sim.run(trace)

    def p50(result) -> float:
        return percentile_ms(result.pools[("glm", "eu")].histogram, 50)

    base = run()
    # FRA down: Frankfurt enters at the next colo, further away; failing every request there
    # passes them on to that same next colo.
    moved, passed_on = run({"FRA": [down]}), run({"FRA": [ColoFault(error_rate=1.0)]})
    assert p50(moved) > p50(base) and p50(passed_on) == p50(moved)
    slowed = run({"FRA": [slow]})
    assert p50(base) < p50(slowed) <= p50(base) + 400  # another colo, if nearer than 400 ms more
    # Every colo near Frankfurt failing: nothing takes the requests (503s).
    near = [c.colo_id for c in world.ranker.rank("glm", ClientLocation(50.11, 8.68, "header"))]
    shed = run({colo: [ColoFault(error_rate=1.0)] for colo in near})
    assert shed.sheds[("glm", "eu")] == shed.arrivals and not shed.pools[("glm", "eu")].requests
    # Every eu colo down from 200 s to 300 s: its clients enter at another region's colos and
    # are served there meanwhile, then come home.
    window = ColoFault(down=True, start_after_s=200, duration_s=100)
    result = run({colo: [window] for colo in world.regions.colos_of("eu")})
    served = result.requests_timeline
    eu = result.regions.index("eu")
    assert served[eu, :4].sum() > 0.99 * served[:, :4].sum()
    assert served[eu, 4:6].sum() == 0 and served[:, 4:6].sum() > 0
    assert served[eu, 6:].sum() > 0.99 * served[:, 6:].sum()
    # Cached routing stays exact under drills.
    computed = run({"FRA": [ColoFault(error_rate=0.5, start_after_s=100, duration_s=300)]},
                   cache_routes=False)  # fmt: skip
    cached = run({"FRA": [ColoFault(error_rate=0.5, start_after_s=100, duration_s=300)]})
    assert cached.pools[("glm", "eu")].histogram == computed.pools[("glm", "eu")].histogram
    with pytest.raises(ValueError, match=r"colo faults: unknown colos \['XXX'\]"):
        Simulator(world, specs, colo_faults={"XXX": [down]})


def test_longer_scale_to_zero_delay_means_fewer_cold_starts_and_more_replica_seconds():
    world = _world()
    runs = compare(
        world,
        lambda: _poisson(world, 1 / 400, 4 * 3600.0),
        {"glm": _spec(initial_replicas=0)},
        [scale_to_zero(120), scale_to_zero(300), scale_to_zero(1200)],
    )
    figures = [totals(result) for _, result in runs]
    colds = [f["cold_starts"] for f in figures]
    replica_s = [f["replica_s"] for f in figures]
    assert colds[0] > colds[1] > colds[2]
    assert replica_s[0] < replica_s[1] < replica_s[2]


def test_cached_routing_decides_exactly_as_computing_every_request():
    world = synthetic_world(60, 6, seed=2)
    spec = TraceSpec(requests=8000, duration_s=3 * 3600, model_shares={"glm": 1, "embedding": 1})
    specs = {"glm": _spec(initial_replicas=0), "embedding": _spec(initial_replicas=0)}
    results = [
        Simulator(world, specs, SimSettings(cache_routes=cached)).run(generate(spec, world.origins))
        for cached in (True, False)
    ]
    cached, computed = results
    assert cached.route_cache_hits > 0 and computed.route_cache_hits == 0
    for key in cached.pools:
        assert cached.pools[key].histogram == computed.pools[key].histogram
        assert cached.pools[key].timeline == computed.pools[key].timeline


def test_generated_trace_is_seeded_and_follows_local_time():
    origins = [Origin("greenwich", 51.5, 0.0), Origin("antipode", -40.0, 180.0)]
    spec = TraceSpec(requests=50_000, model_shares={"glm": 1, "kimi": 3}, seed=4)
    first = list(generate(spec, origins).chunks())
    again = list(generate(spec, origins).chunks())
    assert all(np.array_equal(a.t_s, b.t_s) for a, b in zip(first, again, strict=True))
    t = np.concatenate([c.t_s for c in first])
    origin = np.concatenate([c.origin for c in first])
    model = np.concatenate([c.model for c in first])
    assert abs(len(t) - 50_000) < 5 * np.sqrt(50_000)
    assert np.all(np.diff(np.concatenate([c.t_s for c in first])) >= 0)
    hour = (t // 3600).astype(int)
    # Greenwich peaks at 14:00 UTC, the antipode twelve hours later.
    assert np.sum((origin == 0) & (hour == 14)) > 5 * np.sum((origin == 0) & (hour == 2))
    assert np.sum((origin == 1) & (hour == 2)) > 5 * np.sum((origin == 1) & (hour == 14))
    assert 0.72 < np.mean(model == 1) < 0.78


def test_load_tester_records_replay_as_a_trace(tmp_path: Path):
    records = [
        RequestRecord(
            seq=i,
            scheduled_s=i * 0.5,
            sent_s=i * 0.5,
            model="glm",
            task="chat",
            api="openai",
            endpoint="/v1/chat/completions",
            region=region,
            stream=False,
            status=200,
            ok=True,
            error_kind="",
            error="",
            latency_ms=120.0,
            ttfb_ms=100.0,
            ttft_ms=None,
            tokens=None,
            send_lag_ms=0.1,
            edge=EdgeHeaders(colo="FRA", cold_start=i == 0),
        )  # fmt: skip
        for i, region in enumerate(["eu-central", "asia-northeast", "eu-central"])
    ]
    path = tmp_path / "requests.csv"
    write_csv(records, path)
    positions = {"eu-central": (50.11, 8.68), "asia-northeast": (35.68, 139.65)}
    trace, rows = read_loadtest_records(path, positions)
    (chunk,) = list(trace.chunks())
    assert [o.name for o in trace.origins] == ["asia-northeast", "eu-central"]
    assert chunk.t_s.tolist() == [0.0, 0.5, 1.0] and chunk.origin.tolist() == [1, 0, 1]
    assert [r.cold_start for r in rows] == [True, False, False]
    with pytest.raises(ValueError, match="without a position"):
        read_loadtest_records(path, {"eu-central": (50.0, 8.0)})
    with path.open("w") as handle:
        csv.writer(handle).writerows([["seq", "when"], ["1", "x"]])
    with pytest.raises(ValueError, match="not a load tester record"):
        read_loadtest_records(path, positions)


def test_a_replayed_trace_is_in_time_order_whatever_order_its_source_read():
    requests = [
        ReplayedRequest(2.0, "glm", "b"),
        ReplayedRequest(0.5, "kimi", "a"),
        ReplayedRequest(1.0, "glm", "a"),
    ]
    trace = replay_trace(requests, {"a": (0.0, 0.0), "b": (10.0, 10.0)})
    (chunk,) = list(trace.chunks())
    assert chunk.t_s.tolist() == [0.5, 1.0, 2.0]
    assert [trace.models[m] for m in chunk.model] == ["kimi", "glm", "glm"]
    assert [trace.origins[o].name for o in chunk.origin] == ["a", "a", "b"]
    assert trace.duration_s == 3.0 and trace.expected_requests == 3
    with pytest.raises(ValueError, match=r"log: origins without a position: \['b'\]"):
        replay_trace(requests, {"a": (0.0, 0.0)}, source="log")


def test_forecaster_wakes_a_region_ahead_of_yesterdays_morning():
    key = ("glm", "eu")
    config = PrewarmConfig(bucket_s=60, lookahead_s=600, min_expected=1)
    policy = PredictivePrewarm(config, [key])
    morning = range(9 * 60, 18 * 60)  # busy 09:00-18:00, silent otherwise
    floors = {}
    for bucket in range(2 * 24 * 60):
        now = bucket * 60.0
        demand = {key: 5} if (bucket - 1) % 1440 in morning else {}
        floors[bucket] = policy.floors(now, demand).get(key, 0)
    day2 = 1440
    assert floors[day2 + 9 * 60 - 8] == 1  # warm 8 minutes before yesterday's 09:00
    assert floors[day2 + 9 * 60 - 15] == 0  # not a quarter of an hour before
    assert floors[day2 + 3 * 60] == 0  # nights stay cold
    assert floors[9 * 60 - 8] == 0  # the first day has no yesterday to go by


def test_predictive_prewarm_hides_office_hours_cold_starts_for_a_fraction_of_always_warm():
    world = World.with_colo_origins(EdgeConfig.model_validate({"regions": THREE_REGIONS}))
    spec = TraceSpec(
        requests=12_000, duration_s=2 * 86400.0, shape="follow-the-sun", trough_ratio=0.0,
        model_shares={"glm": 1}, seed=5,
    )  # fmt: skip
    from edge_sim.plan.policies import always_warm

    runs = compare(
        world,
        lambda: generate(spec, world.origins),
        {"glm": _spec(initial_replicas=0)},
        [scale_to_zero(), predictive(), always_warm()],
        SimSettings(measure_from_s=86400.0),
    )
    zero, ahead, warm = (totals(result) for _, result in runs)
    assert zero["cold_starts"] > 20
    assert ahead["cold_starts"] <= 0.2 * zero["cold_starts"]
    assert zero["replica_s"] < ahead["replica_s"] < warm["replica_s"]
