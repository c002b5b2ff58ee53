"""The peers benchmark's bookkeeping (no Ray): a goal that could not be measured is a miss that
says so, replica CPU is read only from this process's own descendants, and the applications it
deploys are the shipped config's, one pool per model, the peers given our deployments' options."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from benchmarks.peers import cpu
from benchmarks.peers.config import PeersBenchConfig
from benchmarks.peers.suite import edge_app, peer_applications
from benchmarks.peers.verdicts import goals


def test_unmeasured_goals_are_misses_with_a_reason() -> None:
    verdicts = goals({"embeddings": {"clients_32": {"throughput_ratio": 1.8, "p50_ratio": None}}})
    assert verdicts["embeddings_32_clients_throughput_vs_docs_pattern"]["met"] is True
    for name, verdict in verdicts.items():
        if name == "embeddings_32_clients_throughput_vs_docs_pattern":
            continue
        assert verdict["value"] is None and verdict["met"] is False, name
        assert "miss" in verdict["missing"]


def test_goal_directions() -> None:
    results = {
        "embeddings": {
            "clients_32": {"throughput_ratio": 1.4, "p50_ratio": 0.9},
            "clients_1": {"throughput_ratio": 1.0},
        },
        "chat": {
            "ratio_vs_generate_per_request": 5.0,
            "ttft": {"p50_ms": 30.0},
            "router_hop": {"p50_ms": 20.0},
        },
        "decode": {"speedup_8_vs_1": 4.0, "step_ms_p50_batch_1": 5.0},
        "router_cpu": {"embeddings": {"router_cpu_us_per_request": 1200.0}},
    }
    met = {name: verdict["met"] for name, verdict in goals(results).items()}
    assert met == {
        "embeddings_32_clients_throughput_vs_docs_pattern": False,  # 1.4 < 1.5
        "embeddings_32_clients_p50_vs_docs_pattern": True,  # at most 1.0
        "embeddings_1_client_throughput_vs_docs_pattern": True,
        "chat_16_streams_vs_generate_per_request": True,
        "chat_8_vs_1_streams_on_our_runtime": True,
        "ttft_p50_vs_decode_step_plus_router_hop": True,  # 30 / (5 + 20) = 1.2
        "router_cpu_per_embedding_request": False,  # 1.2 ms > 1 ms
    }


def test_worker_pids_see_only_our_descendants() -> None:
    code = "import time; time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        table = cpu.processes()
        mine = {p.pid for p in cpu.descendants(os.getpid(), table)}
        assert child.pid in mine
        assert os.getppid() not in mine and 1 not in mine
        assert cpu.cpu_seconds([os.getpid()]) > 0
    finally:
        child.kill()
        child.wait()


def test_the_edge_app_is_one_pool_per_model_and_peers_get_our_embedding_options() -> None:
    config = PeersBenchConfig(models_dir=Path("/models"))
    shipped = yaml.safe_load(config.serve_config.read_text())
    (shipped_app,) = shipped["applications"]
    edge = edge_app(config, shipped)
    names = {d["name"] for d in edge["deployments"]}
    assert {"embedding", "router"} <= names and "embedding-eu" not in names
    (embedding_eu,) = [d for d in shipped_app["deployments"] if d["name"] == "embedding-eu"]
    (embedding_peer,) = [
        a for a in peer_applications(edge, config) if a["name"] == "peer-embedding"
    ]
    assert (
        embedding_peer["deployments"][0]["max_ongoing_requests"]
        == (embedding_eu["max_ongoing_requests"])
    )
