"""The served suites' bookkeeping (no Ray): a goal that could not be measured is a miss that says
so, peers' goals exist only when the peer ran, replica CPU is read only from this process's own
descendants, the applications deployed are the shipped config's, one pool per model, the peers
given our deployments' options, and the client-side load counts only its measuring window."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.chat import peer as chat_peer
from benchmarks.chat.suite import ChatBenchConfig
from benchmarks.chat.suite import goals as chat_goals
from benchmarks.chat.vllm_peer import vllm_command
from benchmarks.embeddings import peer as embedding_peer
from benchmarks.embeddings.suite import EmbeddingsBenchConfig, compare_runs
from benchmarks.embeddings.suite import goals as embedding_goals
from benchmarks.lib import processes
from benchmarks.lib.edge_app import edge_application, shipped_config
from benchmarks.lib.http_load import closed_loop_throughput
from benchmarks.router.suite import GOAL_BASELINE, OURS, baseline_applications, compare
from deployments.config import PROJECT_ROOT

MODELS = Path("/models")
SERVE_CONFIG = PROJECT_ROOT / "serve_config.yaml"


def test_unmeasured_embedding_goals_are_misses_with_a_reason() -> None:
    config = EmbeddingsBenchConfig(models_dir=MODELS)
    verdicts = embedding_goals({"clients_32": {"throughput_ratio": 1.8, "p50_ratio": None}}, config)
    assert verdicts["embeddings_32_clients_throughput_vs_docs_pattern"]["met"] is True
    for name, verdict in verdicts.items():
        if name == "embeddings_32_clients_throughput_vs_docs_pattern":
            continue
        assert verdict["value"] is None and verdict["met"] is False, name
        assert "miss" in verdict["missing"]


def test_embedding_goal_directions_and_no_peer_goal_without_the_peer() -> None:
    result = {
        "clients_32": {"throughput_ratio": 1.4, "p50_ratio": 0.9},
        "clients_1": {"throughput_ratio": 1.0},
        "batching_speedup": {"http": 3.2},
    }
    met = {
        name: verdict["met"]
        for name, verdict in embedding_goals(
            result, EmbeddingsBenchConfig(models_dir=MODELS)
        ).items()
    }
    assert met == {
        "embedding_batching_speedup": True,
        "embeddings_32_clients_throughput_vs_docs_pattern": False,  # 1.4 < 1.5
        "embeddings_1_client_throughput_vs_docs_pattern": True,  # at least 1.0
        "embeddings_32_clients_p50_vs_docs_pattern": True,  # at most 1.0
    }
    alone = EmbeddingsBenchConfig(models_dir=MODELS, peers=False)
    assert set(embedding_goals(result, alone)) == {"embedding_batching_speedup"}


def test_the_ttft_goal_is_judged_against_one_decode_step_plus_the_router_hop() -> None:
    result = {
        "ttft_http": {"ttft_ms": {"p50": 30.0}},
        "decode_step": {"batch_1_ms": {"p50": 5.0}},
        "router_hop_ms": {"p50": 20.0},
        "concurrent": {"ratio_vs_generate_per_request": 3.9},
    }
    verdicts = chat_goals(result, ChatBenchConfig(models_dir=MODELS))
    ttft = verdicts["ttft_p50_vs_decode_step_plus_router_hop"]
    assert (ttft["value"], ttft["met"]) == (1.2, True)  # 30 / (5 + 20), at most 1.2
    assert ttft["details"]["router_hop_p50_ms"] == 20.0
    assert verdicts["chat_16_streams_vs_generate_per_request"]["met"] is False  # 3.9 < 4
    no_hop = chat_goals(
        {**result, "router_hop_ms": {"p50": None}}, ChatBenchConfig(models_dir=MODELS)
    )
    assert no_hop["ttft_p50_vs_decode_step_plus_router_hop"]["met"] is False
    alone = ChatBenchConfig(models_dir=MODELS, peers=False)
    assert set(chat_goals(result, alone)) == {"ttft_p50_vs_decode_step_plus_router_hop"}


def test_the_vllm_goals_are_misses_that_say_why_until_vllm_is_measured() -> None:
    no_python = chat_goals({}, ChatBenchConfig(models_dir=MODELS))
    names = [
        f"{m}_{g}" for m in ("glm", "kimi") for g in ("chat_16_streams_vs_vllm", "ttft_p50_vs_vllm")
    ]
    for name in names:
        assert no_python[name]["met"] is False
        assert "--vllm-python" in no_python[name]["missing"]
    config = ChatBenchConfig(models_dir=MODELS, vllm_python=Path("/venv/bin/python"))
    result = {
        "vs_vllm": {
            "glm": {"tokens_per_s_ratio": 1.6, "ttft_p50_ratio": 1.1},
            "kimi": {"error": "RuntimeError: vLLM exited with 1 while starting"},
        }
    }
    verdicts = chat_goals(result, config)
    assert verdicts["glm_chat_16_streams_vs_vllm"]["met"] is True  # 1.6 >= 1.5
    assert verdicts["glm_ttft_p50_vs_vllm"]["met"] is False  # 1.1 > 1.0: a TTFT must not be longer
    assert verdicts["kimi_ttft_p50_vs_vllm"]["missing"].endswith("exited with 1 while starting")
    other = {"same_model": {"greedy_tokens_equal": False}, "tokens_per_s_ratio": 3.0}
    differs = chat_goals({"vs_vllm": {"glm": other}}, config)["glm_chat_16_streams_vs_vllm"]
    assert differs["met"] is False and "not the same weights" in differs["missing"]
    glm_only = ChatBenchConfig(models_dir=MODELS, vllm_python=Path("/p"), vllm_models=["glm"])
    assert not any(name.startswith("kimi") for name in chat_goals(result, glm_only))
    with pytest.raises(ValueError, match="llama"):
        ChatBenchConfig(models_dir=MODELS, vllm_models=["glm", "llama"])


def test_vllm_is_started_at_its_defaults_on_the_checkpoint_under_the_models_name() -> None:
    command = vllm_command(Path("/venv/bin/python"), Path("/tmp/ckpt/glm"), "glm", 8123)
    assert command[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    options = dict(zip(command[3::2], command[4::2], strict=True))
    assert options == {
        "--model": "/tmp/ckpt/glm",
        "--served-model-name": "glm",
        "--host": "127.0.0.1",
        "--port": "8123",
        "--dtype": "float32",
        "--gpu-memory-utilization": "0.1",
    }


def test_rounds_compare_as_medians_and_ratios_need_both_sides() -> None:
    def run(rate: float, p50: float | None) -> dict:
        return {"requests_per_s": rate, "latency_ms": {"p50": p50}}

    both = compare_runs(
        {"ours": [run(10, 4.0), run(30, 2.0), run(20, 3.0)], "docs_pattern": [run(10, 6.0)]}
    )
    assert both["ours"]["requests_per_s"] == 20 and both["ours"]["p50_ms"] == 3.0
    assert (both["throughput_ratio"], both["p50_ratio"]) == (2.0, 0.5)
    alone = compare_runs({"ours": [run(10, None)]})
    assert alone["ours"]["p50_ms"] is None and "throughput_ratio" not in alone


def test_router_overhead_compares_ours_with_every_baseline() -> None:
    latencies = {OURS: [0.010, 0.012, 0.011], GOAL_BASELINE: [0.005, 0.006, 0.0055]}
    result = compare(latencies)
    assert result["latency_ms"][OURS]["p50"] == 11.0
    assert result["ratio_p50"] == {GOAL_BASELINE: 2.0}
    assert result["router_added_p50_ms"] == {GOAL_BASELINE: 5.5}


def test_worker_pids_see_only_our_descendants() -> None:
    code = "import time; time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        table = processes.processes()
        mine = {p.pid for p in processes.descendants(os.getpid(), table)}
        assert child.pid in mine
        assert os.getppid() not in mine and 1 not in mine
        assert processes.cpu_seconds([os.getpid()]) > 0
    finally:
        child.kill()
        child.wait()


def test_the_edge_app_is_one_pool_per_model_and_peers_get_our_deployments_options() -> None:
    shipped = shipped_config(SERVE_CONFIG)
    edge = edge_application(shipped, MODELS)
    names = {d["name"] for d in edge["deployments"]}
    assert {"embedding", "glm", "router"} <= names and "embedding-eu" not in names
    options = {d["name"]: d for d in edge["deployments"]}
    assert options["embedding"]["num_replicas"] == 1 and "autoscaling_config" not in options["glm"]
    for peer, ours in ((embedding_peer, "embedding"), (chat_peer, "glm")):
        (deployment,) = peer.peer_application(edge)["deployments"]
        assert deployment["max_ongoing_requests"] == options[ours]["max_ongoing_requests"]


def test_the_settings_under_test_change_only_their_deployments() -> None:
    shipped = shipped_config(SERVE_CONFIG)
    edge = edge_application(shipped, MODELS)
    changed = edge_application(shipped, MODELS, embedding_batch_size=1, router_replicas=3)
    before = {d["name"]: d for d in edge["deployments"]}
    after = {d["name"]: d for d in changed["deployments"]}
    assert after["embedding"]["user_config"]["max_batch_size"] == 1
    assert before["embedding"]["user_config"]["max_batch_size"] > 1  # batching as shipped
    assert after["router"]["num_replicas"] == 3
    assert {k: v for k, v in after.items() if k not in ("embedding", "router")} == {
        k: v for k, v in before.items() if k not in ("embedding", "router")
    }
    assert edge["args"]["edge"]["latency"]["real_delay_scale"] == 0  # no simulated RTT slept


def test_router_baselines_stand_in_with_the_options_of_what_they_replace() -> None:
    edge = edge_application(shipped_config(SERVE_CONFIG), MODELS)
    options = {d["name"]: d for d in edge["deployments"]}
    for app in baseline_applications(edge):
        (deployment,) = app["deployments"]
        source = "moderation" if app["name"] == "model-ingress" else "router"
        expected = {k: v for k, v in options[source].items() if k != "name"}
        assert {k: v for k, v in deployment.items() if k != "name"} == expected, app["name"]
        assert app["import_path"].startswith("benchmarks.router.passthroughs:")


def test_closed_loop_throughput_counts_only_requests_inside_the_window() -> None:
    now = [0.0]

    def clock() -> float:
        return now[0]

    async def send(n: int) -> None:
        now[0] += 0.25  # every request takes a quarter of a second, one client
        await asyncio.sleep(0)

    result = asyncio.run(closed_loop_throughput(send, 1, warmup_s=1.0, measure_s=2.0, clock=clock))
    # Finished at 0.25, 0.5, ... 3.0: those at 1.0 through 3.0 count, 9 of them.
    assert result["requests_per_s"] == 4.5
    assert result["latency_ms"]["count"] == 9 and result["latency_ms"]["p50"] == 250.0
