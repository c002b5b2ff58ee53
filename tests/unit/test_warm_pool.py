"""The warm pool's bookkeeping with a fake raylet: which fresh workers are its own, how many it
asks for, and the runtime_env its workers and the model replicas share."""

from __future__ import annotations

import ast
import gc
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from benchmarks.coldstart.warm_pool import NO_POOL_ROUTE, no_warm_pool_application
from deployments.config import PROJECT_ROOT, parse_app_config
from deployments.control.warm_pool import (
    SETUP_HOOK,
    NodeAddress,
    NodePool,
    PoolKeeper,
    WarmPoolConfig,
    preload,
    warm_runtime_env,
)
from deployments.ray_ext.worker_setup import SETUP_HOOK_ENV_VAR
from deployments.serve_file import check_serve_config


def test_a_node_with_no_workers_of_ours_asks_for_the_target():
    pool = NodePool(target=2, start_grace_s=30)
    assert pool.missing([], now=0.0) == 2
    assert pool.starting == 2


def test_workers_on_the_node_before_any_request_are_not_ours():
    # Ray prestarts one worker per CPU at node start, without our runtime_env.
    pool = NodePool(target=2, start_grace_s=30)
    assert pool.missing([11, 12, 13], now=0.0) == 2
    assert pool.ours == set()


def test_workers_asked_for_are_not_asked_again_while_they_start():
    pool = NodePool(target=2, start_grace_s=30)
    pool.missing([], now=0.0)
    assert pool.missing([], now=5.0) == 0
    assert pool.missing([21], now=6.0) == 0  # one arrived, one still starting
    assert pool.ours == {21} and pool.starting == 1


def test_a_worker_taken_by_a_replica_is_replaced():
    pool = NodePool(target=2, start_grace_s=30)
    pool.missing([], now=0.0)
    pool.missing([21, 22], now=5.0)
    assert pool.ours == {21, 22}
    assert pool.missing([22], now=10.0) == 1  # 21 became a replica
    assert pool.ours == {22}


def test_a_taken_worker_is_replaced_only_after_the_refill_delay():
    pool = NodePool(target=2, start_grace_s=30, refill_delay_s=3)
    assert pool.missing([], now=0.0) == 2  # filling the pool is never delayed
    pool.missing([21, 22], now=5.0)
    assert pool.missing([22], now=10.0) == 0  # 21 became a replica: its first requests run
    assert pool.missing([22], now=12.9) == 0
    assert pool.missing([22], now=13.0) == 1
    assert pool.ours == {22} and pool.starting == 1


def test_a_start_that_never_shows_up_expires_and_is_asked_again():
    pool = NodePool(target=1, start_grace_s=30)
    assert pool.missing([], now=0.0) == 1
    assert pool.missing([], now=29.0) == 0
    assert pool.missing([], now=31.0) == 1


def test_a_foreign_worker_appearing_while_none_is_asked_for_is_not_counted():
    pool = NodePool(target=1, start_grace_s=30)
    pool.missing([], now=0.0)
    pool.missing([21], now=5.0)
    assert pool.missing([21, 99], now=6.0) == 0
    assert pool.ours == {21}


class FakeRaylet:
    def __init__(self, address: str, log: list[tuple[str, int, str, int]], idle: list[int]):
        self.address, self.log, self.idle = address, log, idle

    def fresh_idle_workers(self) -> list[int]:
        return list(self.idle)

    def prestart(self, count: int, runtime_env: str, keep_alive_s: int) -> None:
        self.log.append((self.address, count, runtime_env, keep_alive_s))


def fake_keeper(idle: dict[str, list[int]], **config: Any) -> tuple[PoolKeeper, list[Any]]:
    log: list[tuple[str, int, str, int]] = []
    nodes = [NodeAddress(f"node-{a}", a) for a in idle]
    keeper = PoolKeeper(
        WarmPoolConfig.model_validate(config),
        '{"env_vars": {"X": "1"}}',
        raylet=lambda address: FakeRaylet(address, log, idle[address]),
        nodes=lambda: nodes,
        clock=lambda: 0.0,
    )
    return keeper, log


def test_every_node_is_topped_up_with_the_pools_own_runtime_env_and_keep_alive():
    keeper, log = fake_keeper({"a:1": [], "b:2": [7]}, workers_per_node=2, keep_alive_s=120)
    assert keeper.top_up() == {"node-a:1": 2, "node-b:2": 2}
    assert sorted(log) == [
        ("a:1", 2, '{"env_vars": {"X": "1"}}', 120),
        ("b:2", 2, '{"env_vars": {"X": "1"}}', 120),
    ]
    assert keeper.top_up() == {"node-a:1": 0, "node-b:2": 0}  # still starting


def test_describe_reports_each_nodes_idle_and_starting_workers():
    keeper, _ = fake_keeper({"a:1": []}, workers_per_node=1)
    keeper.top_up()
    assert keeper.describe() == {
        "workers_per_node": 1,
        "nodes": {"node-a:1": {"idle": [], "starting": 1}},
    }


def test_a_pool_of_zero_workers_asks_for_none():
    keeper, log = fake_keeper({"a:1": []}, workers_per_node=0)
    keeper.top_up()
    assert log == []


def test_a_pool_is_full_once_its_workers_arrived_and_until_one_is_taken():
    pool = NodePool(target=2, start_grace_s=30, refill_delay_s=3)
    pool.missing([], now=0.0)
    assert not pool.full(0.0)  # asked for, starting
    pool.missing([21, 22], now=5.0)
    assert pool.full(5.0)
    pool.missing([22], now=10.0)  # 21 became a replica: its replacement waits
    assert not pool.full(10.0) and not pool.full(12.0)


class PacedRig:
    """A keeper over nodes and idle workers the test changes between rounds, on a clock that
    advances by each round's wait."""

    def __init__(self, idle: dict[str, list[int]]):
        self.idle, self.now, self.asked = idle, 0.0, 0
        self.keeper = PoolKeeper(
            WarmPoolConfig(workers_per_node=1, refill_delay_s=0),
            "{}",
            raylet=lambda address: FakeRaylet(address, [], self.idle[address]),
            nodes=lambda: [NodeAddress(f"node-{a}", a) for a in self.idle],
            clock=lambda: self.now,
        )

    def round(self) -> float:
        self.asked += sum(self.keeper.top_up().values())
        self.now += self.keeper.wait_s
        return self.keeper.wait_s


def test_rounds_slow_down_while_every_pool_stays_full_and_speed_up_when_one_changes():
    rig = PacedRig({"a:1": []})
    assert rig.round() == 2.0  # asked for a worker
    rig.idle["a:1"].append(21)
    assert [rig.round() for _ in range(6)] == [4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    rig.idle["a:1"].clear()  # a replica started by Serve's autoscaler took it
    assert rig.round() == 2.0 and rig.asked == 2
    rig.idle["a:1"].append(22)
    assert rig.round() == 4.0
    rig.idle["b:2"] = [31]  # a node joined (31 started with it, not ours): it fills fast
    assert rig.round() == 2.0 and rig.asked == 3
    rig.idle["b:2"].append(32)  # the worker asked for arrived: every pool full again
    assert [rig.round() for _ in range(2)] == [4.0, 8.0]
    del rig.idle["b:2"]  # the node left: forgotten, and the next round comes soon
    assert rig.round() == 2.0
    assert list(rig.keeper.describe()["nodes"]) == ["node-a:1"]
    rig.keeper.failed()
    assert rig.keeper.wait_s == 2.0


def test_the_warm_runtime_env_adds_the_setup_hook_and_keeps_the_apps_variables():
    env = warm_runtime_env({"env_vars": {"A": "1"}, "working_dir": "."})
    assert env == {"env_vars": {"A": "1", SETUP_HOOK_ENV_VAR: SETUP_HOOK}, "working_dir": "."}
    # The hook names a function Ray can import in a fresh worker.
    module, _, name = SETUP_HOOK.rpartition(".")
    assert callable(getattr(sys.modules[module], name))


def test_preload_imports_the_modules_and_survives_one_that_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    (tmp_path / "warm_probe_ok.py").write_text(textwrap.dedent("LOADED = True\n"))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        preload(("warm_probe_missing_module", "warm_probe_ok"))
    finally:
        gc.unfreeze()  # preload froze this test process's objects too
    assert sys.modules["warm_probe_ok"].LOADED


@pytest.mark.parametrize(
    "bad",
    [
        {"workers_per_node": -1},
        {"keep_alive_s": 1},
        {"check_interval_s": 0},
        {"check_interval_s": 10, "idle_check_interval_s": 5},
        {"size": 2},
    ],
)
def test_the_config_refuses_bad_values(bad: dict[str, Any]):
    with pytest.raises(ValidationError):
        WarmPoolConfig.model_validate(bad)


def test_the_shipped_config_enables_the_pool():
    shipped = yaml.safe_load((PROJECT_ROOT / "serve_config.yaml").read_text())
    (edge,) = [a for a in shipped["applications"] if a["name"] == "edge"]
    pool = parse_app_config(edge["args"]).warm_pool
    assert pool.enabled and pool.workers_per_node >= 1


def test_the_benchmarks_copy_without_the_pool_passes_the_config_check(tmp_path: Path):
    config = yaml.safe_load((PROJECT_ROOT / "serve_config.yaml").read_text())
    edge = config["applications"][0]
    without = no_warm_pool_application(edge)
    config["applications"].append(without)
    path = tmp_path / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert check_serve_config(path) == []
    assert without["route_prefix"] == NO_POOL_ROUTE and without["name"] != edge["name"]
    assert not parse_app_config(without["args"]).warm_pool.enabled
    assert parse_app_config(edge["args"]).warm_pool.enabled  # the shipped app is left as it was


def test_what_the_pool_preloads_pulls_in_no_export_only_packages():
    # torch and transformers are for export only: a replica (and each idle warm worker) that
    # imported them would pay seconds and hundreds of MB for nothing.
    code = (
        "import gc, sys; from deployments.control.warm_pool import preload; preload(); "
        "print(gc.get_freeze_count()); print(sorted({m.split('.')[0] for m in sys.modules}))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=120
    )
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    *_, frozen, modules = loaded.stdout.strip().splitlines()
    packages = set(ast.literal_eval(modules))
    # What it imported is frozen, out of the full collection Ray Serve runs after __init__.
    assert int(frozen) > 50_000
    # onnx serves too: a chat runtime rewrites its graph's head when it loads (~5 MB imported).
    assert {"onnxruntime", "onnx", "tokenizers", "deployments"} <= packages
    assert not packages & {"torch", "transformers"}
