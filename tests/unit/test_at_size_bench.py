"""The at-size suite's parts that need no cluster: FLOPs per token from a config against the
model's own weights, the application it serves, its goals (medians, k of n, misses that say
why) and the export options its quick form builds with."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch
import yaml

from benchmarks.at_size.cold_start import cold_start_config
from benchmarks.at_size.config import AtSizeBenchConfig, config_from_args
from benchmarks.at_size.models import at_size_application, vllm_env, vllm_rows
from benchmarks.at_size.replica_memory import replica_memory
from benchmarks.at_size.roof import flops_per_token, gemm_flops_per_s, weight_gemms
from benchmarks.at_size.verdicts import NO_PEERS, NO_VLLM, goals
from benchmarks.atrest.serve_files import model_deployments
from benchmarks.lib.goals import UNMEASURED, goal_over_runs, goals_table
from deployments.config import parse_app_config
from deployments.export.at_size import build_large
from deployments.export.llm_families import FAMILIES


def _linear_weights(model: torch.nn.Module) -> int:
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def test_glm_flops_per_token_are_twice_its_linear_weights_plus_attention() -> None:
    config = FAMILIES["glm"].tiny_config(512, 0)
    model = FAMILIES["glm"].model_class(config)
    as_dict = config.to_dict()
    assert sum(k * n * c for k, n, c in weight_gemms(as_dict)) == _linear_weights(model)
    attention = flops_per_token(as_dict, 100) - flops_per_token(as_dict, 0)
    heads, head_dim, layers = 4, 32, 2
    assert attention == 2 * heads * 2 * head_dim * 100 * layers


def test_kimi_flops_count_the_routed_experts_a_token_goes_through_not_all_of_them() -> None:
    config = FAMILIES["kimi"].tiny_config(512, 0)
    model = FAMILIES["kimi"].model_class(config)
    as_dict = config.to_dict()
    # Each MoE layer holds n_routed experts (fused tensors) and a router; a token runs
    # num_experts_per_tok of the experts. Everything else is a Linear.
    layer = model.model.layers[1].mlp
    per_expert = sum(p.numel() for p in layer.experts.parameters()) // config.n_routed_experts
    moe_layers = config.num_hidden_layers - config.first_k_dense_replace
    routed = moe_layers * config.num_experts_per_tok * per_expert
    router = moe_layers * layer.gate.weight.numel()
    active = _linear_weights(model) + routed + router
    assert sum(k * n * c for k, n, c in weight_gemms(as_dict)) == active


def test_an_unknown_architecture_has_no_flop_count() -> None:
    with pytest.raises(ValueError, match="no FLOP count for model_type 'bert'"):
        weight_gemms(
            {"model_type": "bert", "hidden_size": 8, "num_hidden_layers": 1, "vocab_size": 9}
        )


def test_the_gemm_roof_is_measured_at_the_step_shape() -> None:
    measured = gemm_flops_per_s([(64, 32, 3), (32, 64, 1)], rows=16, repeats=2)
    assert measured["rows"] == 16 and measured["shapes"] == 2 and measured["gflops_per_s"] > 0


def _args(*extra: str) -> argparse.Namespace:
    from benchmarks import run as bench

    return bench.build_parser(bench.load_suites()).parse_args(["--models-dir", "models", *extra])


def test_the_application_serves_the_at_size_exports_beside_the_defaults(tmp_path: Path) -> None:
    config = config_from_args(_args("--at-size-dir", str(tmp_path), "--at-size-layers", "2"))
    app = at_size_application(config)
    parsed = parse_app_config(app["args"])
    assert set(parsed.models) >= {"glm", "glm-int8", "kimi", "embedding", "moderation"}
    assert parsed.model_path("glm") == tmp_path.resolve() / "layers-2" / "glm"
    assert parsed.model_path("glm-int8") == tmp_path.resolve() / "layers-2" / "glm-int8"
    assert parsed.models["glm-int8"].intra_op_threads == config.threads
    assert parsed.model_path("embedding") == Path("models").resolve() / "embedding"
    assert {d["name"] for d in app["deployments"]} >= {"glm", "glm-int8", "kimi"}
    assert "glm-int8" in app["args"]["security"]["moderation_gate"]["models"]


def test_quick_serves_a_two_layer_glm_once_and_vllm_rows_pair_dtypes() -> None:
    quick = config_from_args(_args("--quick", "--no-peers"))
    assert (quick.layers, quick.models, quick.runs, quick.peers) == (2, ["glm"], 1, False)
    assert quick.exports() == ["glm", "glm-int8"]
    assert config_from_args(_args("--runs", "3")).runs == 3
    fp32, best = vllm_rows("glm")
    assert (fp32.dtype, fp32.ours, best.dtype, best.ours) == (
        "float32",
        ("glm", "glm-int8"),
        "bfloat16",
        ("glm-int8",),
    )
    assert vllm_rows("kimi")[1].ours == ("kimi",)
    assert vllm_env(quick)["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"


def _config(**fields: object) -> AtSizeBenchConfig:
    return AtSizeBenchConfig(models_dir=Path("/m"), models=["glm"], **fields)  # type: ignore[arg-type]


def _run(ours: float, int8: float, vllm: float) -> dict[str, dict[str, float | None]]:
    def side(rate: float) -> dict[str, float | None]:
        return {
            "concurrent_tokens_per_s": rate,
            "one_at_a_time_tokens_per_s": rate / 8,
            "ttft_p50_ms": 1000 / rate if rate else None,
        }

    return {"glm": side(ours), "glm-int8": side(int8), "vllm": side(vllm)}


def test_goals_take_the_median_of_the_runs_and_say_in_how_many_each_was_met() -> None:
    result = {
        "roof": {"glm": {"flops_per_token": 1e9, "gemm": {"gflops_per_s": 200.0}}},
        "int8_agreement": {"glm": {"equal_share": 0.97}},
        "decode_stall": {"glm": [{"p99_during_over_median_before": r} for r in (1.5, 2.5, 1.9)]},
        "sides": {
            "glm": {
                "fp32": {"runs": [_run(200, 450, 100), _run(140, 290, 100), _run(160, 320, 100)]},
                "best": {"runs": [_run(0, 300, 150)] * 3},
            }
        },
        "cold_start": {"glm": _cold_cycles(1.2, 1.3, 1.9)},
    }
    verdicts = goals(result, _config(vllm_python=Path("/v/python")))
    concurrent = verdicts["glm_fp32_16_concurrent_vs_vllm"]
    assert (concurrent["value"], concurrent["met"], concurrent["met_in"]) == (1.6, True, "2 of 3")
    ttft = verdicts["glm_fp32_ttft_p50_vs_vllm"]  # 1000/rate: ours/theirs = 100/rate_ours
    assert ttft["at_most"] and ttft["value"] == 0.625 and ttft["met_in"] == "3 of 3"
    assert verdicts["glm_int8_16_concurrent_vs_vllm_fp32"]["met_in"] == "2 of 3"
    assert verdicts["glm_int8_16_concurrent_vs_vllm_best"]["value"] == 2.0
    roof = verdicts["glm_compute_roof_share_16"]  # 160 tokens/s x 1 GFLOP over 200 GFLOP/s
    assert roof["value"] == 0.8 and roof["met_in"] == "3 of 3"
    assert verdicts["glm_int8_greedy_agreement"]["met"] is True
    stall = verdicts["glm_tpot_p99_during_prefill_vs_median"]
    assert (stall["value"], stall["met"], stall["met_in"]) == (1.9, True, "2 of 3")
    cold = verdicts["glm_cold_start_p50_s"]
    assert (cold["value"], cold["met"], cold["at_most"]) == (1.3, True, True)
    assert cold["details"]["per_cycle_s"] == [1.2, 1.3, 1.9]


def _cold_cycles(*answered_s: float | None) -> dict[str, object]:
    cycles = [{"answered_s": s} for s in answered_s]
    found = [s for s in answered_s if s is not None]
    return {"cycles": cycles, "answered": len(found), "p50_s": sorted(found)[len(found) // 2]}


def test_a_cold_start_cycle_unanswered_leaves_the_goal_unmeasured_not_flattered() -> None:
    result = {"cold_start": {"glm": _cold_cycles(1.2, None, 1.3)}}
    record = goals(result, _config())["glm_cold_start_p50_s"]
    assert record["value"] is None and record["missing"] == "2 of 3 cycles answered from zero"
    failed = {"cold_start": {"glm": {"error": "TimeoutError('not RUNNING')"}}}
    record = goals(failed, _config())["glm_cold_start_p50_s"]
    assert not record["met"] and record["missing"] == "TimeoutError('not RUNNING')"
    assert goals({}, _config())["glm_cold_start_p50_s"]["missing"] == UNMEASURED


def test_the_cold_start_runs_the_shipped_config_with_the_model_at_size(tmp_path: Path) -> None:
    config = config_from_args(_args("--at-size-dir", str(tmp_path), "--at-size-layers", "2"))
    served = cold_start_config(config, "glm", tmp_path / "data")
    (app,) = served["applications"]
    parsed = parse_app_config(app["args"])
    assert parsed.model_path("glm") == tmp_path.resolve() / "layers-2" / "glm"
    assert parsed.models["glm"].intra_op_threads == config.threads
    assert parsed.model_path("kimi") == Path("models").resolve() / "kimi"  # the others shipped
    assert "glm-int8" not in parsed.models
    glm_pools = model_deployments(served, "glm")
    assert glm_pools and all(
        d["autoscaling_config"]["downscale_to_zero_delay_s"] == config.cold_idle_delay_s
        for d in glm_pools
    )
    shipped = yaml.safe_load(config.serve_config.read_text())
    assert served["http_options"]["port"] != shipped["http_options"]["port"]


def test_without_a_peer_every_goal_against_vllm_is_a_miss_that_says_why() -> None:
    result = {"sides": {"glm": {"ours": {"runs": [_run(100, 200, 0)]}}}}
    no_peers = goals(result, _config(peers=False))
    assert no_peers["glm_fp32_16_concurrent_vs_vllm"]["missing"] == NO_PEERS
    assert no_peers["glm_int8_16_concurrent_vs_vllm_best"]["met"] is False
    assert goals(result, _config())["glm_fp32_ttft_p50_vs_vllm"]["missing"] == NO_VLLM
    # The roof needs ours only; without a roof measured it is a miss, not a crash.
    assert no_peers["glm_compute_roof_share_16"]["value"] is None
    failed = {"sides": {"glm": {"fp32": {"error": "vLLM exited with 1"}}}}
    record = goals(failed, _config(vllm_python=Path("/v/python")))["glm_fp32_one_at_a_time_vs_vllm"]
    assert record["missing"] == "vLLM exited with 1"


def test_a_decode_stall_run_that_failed_is_a_miss_that_says_why() -> None:
    """Kimi at size answered the long prompt with a 500: the stall goal says so, not a crash."""
    error = "POST http://x/v1/chat/completions: 500 generation failed: Fail"
    result = {"decode_stall": {"glm": [{"p99_during_over_median_before": 1.5}, {"error": error}]}}
    partly = goals(result, _config())["glm_tpot_p99_during_prefill_vs_median"]
    assert (partly["value"], partly["met_in"]) == (1.5, "1 of 2")
    result = {"decode_stall": {"glm": [{"error": error}]}}
    failed = goals(result, _config())["glm_tpot_p99_during_prefill_vs_median"]
    assert failed["met"] is False and failed["missing"] == f"failed: {error}"


def test_the_goals_table_says_in_how_many_runs_a_goal_was_met() -> None:
    record = goal_over_runs([1.2, 1.7, None], 1.5, "x tokens/s")
    assert record["value"] == 1.45 and record["met_in"] == "1 of 3" and not record["met"]
    machine = {"cpus_usable": 2, "load_average_1m": 1.0, "load_average_1m_end": 2.0}
    (line,) = goals_table({"at_size.x": record}, machine, "cmd").splitlines()[2:]
    assert line.endswith("MISSED in 1 of 3 runs")


def test_the_large_export_builds_only_what_it_is_asked_for(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"at-size exports \['glm-fp8'\]"):
        build_large(tmp_path, 2, ["glm-fp8"])
    with pytest.raises(ValueError, match="layers: 0; expected at least 1"):
        build_large(tmp_path, 0, ["glm"])
    assert list(tmp_path.iterdir()) == []


def test_a_second_replica_is_measured_against_the_first_alone(models_root: Path) -> None:
    """Two processes open the tiny GLM as a replica does and answer a request: the node's PSS
    with both over one alone, against the export's data files."""
    measured = replica_memory(models_root / "glm", threads=1)
    graph = models_root / "glm" / "model.onnx"
    data = [p for p in graph.parent.iterdir() if p.name.startswith(graph.name)]
    assert measured["weights_bytes"] == sum(p.stat().st_size for p in data)
    alone, together = measured["one_replica_pss_bytes"], measured["two_replicas_pss_bytes"]
    # Each process holds an interpreter, ONNX Runtime and the model: tens of MB at least.
    assert 20 * 2**20 < alone < together < 2 * alone + measured["weights_bytes"]
    assert measured["second_replica_added_bytes"] == together - alone
    share = measured["second_replica_share_of_weights"]
    assert share == round((together - alone) / measured["weights_bytes"], 4)


def test_a_replica_that_cannot_open_its_model_is_an_error_not_a_hang(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("{}")
    with pytest.raises((RuntimeError, ValueError)):
        replica_memory(tmp_path, threads=1)


def test_without_a_memory_figure_the_second_replica_goal_says_why() -> None:
    result = {"replica_memory": {"glm": {"error": "RuntimeError: unready"}}}
    record = goals(result, _config())["glm_second_replica_pss_share_of_weights"]
    assert record["value"] is None and record["missing"] == "RuntimeError: unready"
    measured = {"replica_memory": {"glm": {"second_replica_share_of_weights": 0.2}}}
    assert goals(measured, _config())["glm_second_replica_pss_share_of_weights"]["met"] is True
