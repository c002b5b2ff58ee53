"""Security benchmarks, each feature measured against the same requests with it off, in one run:
the per-request cost of auth + rate limit + request-limit checks (in-process, microseconds), the
moderation gate's added latency on a live cluster (gate on, then off, same chat requests), and
budget leases through a database outage (SQLite locked by another writer, PostgreSQL killed; in
process, benchmarks.lease_outage). `--security-in-process-only` skips the gate (no cluster)."""

from __future__ import annotations

import argparse
import copy
import sys
import time
import timeit
from pathlib import Path
from typing import Any

import httpx
import yaml
from pydantic import Field

from benchmarks.lease_outage import LEASE_STORES, budget_lease_outage, lease_goals
from benchmarks.lib.cluster import apply_applications, serve_cluster
from benchmarks.lib.config import BenchConfig
from benchmarks.lib.goals import GoalRecord
from deployments.config import PROJECT_ROOT
from deployments.ingress.protocol import ChatCompletionRequest
from deployments.ingress.security import (
    KeyStore,
    RateLimiter,
    SecurityConfig,
    check_chat,
    estimate_chat_tokens,
)
from deployments.serve_file import set_router_listener
from edgectl.loadtest.summary import latency_stats_s
from edgectl.local_cluster import free_port
from edgectl.local_services import postgres_bin_dir

NEEDS_RAY = True  # the moderation gate's latency; the rest runs in process

SERVE_CONFIG = PROJECT_ROOT / "serve_config.yaml"

BODY = {
    "model": "glm",
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Summarise the history of Paris in three sentences."},
    ],
    "max_tokens": 32,
    "temperature": 0,
}


def admission_cost_us(repeat: int) -> dict[str, float]:
    """Microseconds per request for each admission step the router runs before any model call."""
    keys = KeyStore.from_env({"EDGE_API_KEYS": "bench:sk-bench-0123456789"}, SecurityConfig())
    open_keys = KeyStore.from_env({}, SecurityConfig())
    limits = SecurityConfig().request_limits
    unlimited = SecurityConfig.model_validate(
        {"default_limits": {"requests_per_minute": 10**7, "tokens_per_minute": 10**9}}
    )
    limited_keys = KeyStore.from_env({"EDGE_API_KEYS": "bench:sk-bench-0123456789"}, unlimited)
    limiter = RateLimiter()
    header = "Bearer sk-bench-0123456789"

    def parse() -> ChatCompletionRequest:
        return ChatCompletionRequest.model_validate(BODY)

    def features_off() -> None:
        parse()
        open_keys.authenticate(None)

    def features_on() -> None:
        request = parse()
        principal = limited_keys.authenticate(header)
        check_chat(request, limits)
        texts = [m.text for m in request.messages]
        limiter.reserve(principal, estimate_chat_tokens(texts, request.max_tokens, 256)).settle(40)

    def per_call(fn) -> float:
        return min(timeit.repeat(fn, number=repeat, repeat=5)) / repeat * 1e6

    keys.authenticate(header)  # warm
    off, on = per_call(features_off), per_call(features_on)
    return {
        "features_off_us": off,
        "features_on_us": on,
        "added_us": on - off,
        "auth_only_us": per_call(lambda: keys.authenticate(header)),
    }


def _app(gate_models: list[str], models_dir: Path) -> dict[str, Any]:
    app = copy.deepcopy(yaml.safe_load(SERVE_CONFIG.read_text())["applications"][0])
    args = app["args"]
    args["models_dir"] = str(models_dir)
    args["accelerator"] = "cpu"
    args["edge"]["latency"]["real_delay_scale"] = 0
    args["security"]["moderation_gate"]["models"] = gate_models
    set_router_listener(args, None)
    for deployment in app["deployments"]:
        scaling = deployment.get("autoscaling_config")
        if scaling:
            scaling.update(min_replicas=1, initial_replicas=1, max_replicas=1)
    return app


def gate_latency(requests: int, models_dir: Path) -> dict[str, Any]:
    """Chat p50/p99 with the gate on glm, then with no gate: only the router is rebuilt."""
    out: dict[str, Any] = {}
    port = free_port()
    with serve_cluster(num_cpus=4, http_port=port):
        for label, models in (("gate_on", ["glm"]), ("gate_off", [])):
            apply_applications([_app(models, models_dir)], port, timeout_s=240)
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
                headers = {"x-edge-cache": "bypass"}
                for _ in range(5):  # warm-up
                    client.post("/v1/chat/completions", json=BODY, headers=headers)
                samples = []
                for i in range(requests):
                    body = {**BODY, "seed": i}
                    started = time.perf_counter()
                    response = client.post("/v1/chat/completions", json=body, headers=headers)
                    samples.append(time.perf_counter() - started)
                    if response.status_code != 200:
                        raise RuntimeError(f"{label}: {response.status_code} {response.text[:200]}")
            out[label] = latency_stats_s(samples)
            print(f"security: {label} {out[label]}", file=sys.stderr)
    out["added_p50_ms"] = round(out["gate_on"]["p50"] - out["gate_off"]["p50"], 3)
    return out


class SecurityBenchConfig(BenchConfig):
    QUICK = {"admission_repetitions": 2_000, "gate_requests": 20, "lease_outage_s": 1.0}

    admission_repetitions: int = Field(default=20_000, ge=1)
    gate_requests: int = Field(default=80, ge=1, description="chat requests per gate setting")
    gate: bool = Field(default=True, description="also measure the moderation gate (a cluster)")
    lease_keys: int = Field(default=10, ge=1)
    lease_routers: int = Field(default=3, ge=1)
    lease_outage_s: float = Field(
        default=60.0, gt=0, description="SQLite locked, PostgreSQL killed, this long"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("security suite")
    group.add_argument(
        "--security-in-process-only",
        action="store_true",
        help="skip the moderation gate's latency (no cluster): admission cost and budget leases",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    config = SecurityBenchConfig.from_args(args, gate=not args.security_in_process_only)
    # Before a minute of SQLite outage: a machine without PostgreSQL fails here, loudly.
    postgres_bin_dir()
    admission = admission_cost_us(repeat=config.admission_repetitions)
    print(f"security: admission {admission}", file=sys.stderr)
    outages: dict[str, Any] = {}
    goals: dict[str, GoalRecord] = {}
    for store in LEASE_STORES:
        outages[store] = budget_lease_outage(
            config.lease_keys, config.lease_routers, config.lease_outage_s, store=store
        )
        store_goals = lease_goals(outages[store], store)
        print(f"security: budget leases, {store}: {store_goals}", file=sys.stderr)
        goals |= store_goals
    result: dict[str, Any] = {
        "config": config.model_dump(mode="json"),
        "admission": admission,
        "lease_outage": outages,
        "goals": goals,
    }
    if config.gate:
        result["moderation_gate"] = gate_latency(config.gate_requests, config.models_dir)
    return result
