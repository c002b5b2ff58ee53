"""Security benchmarks, each feature measured against the same requests with it off, in one run:
the per-request cost of auth + rate limit + request-limit checks (in-process, microseconds), the
moderation gate's added latency on a live cluster (gate on, then off, same chat requests), and
budget leases through an outage (SQLite locked by another writer, in process)."""

from __future__ import annotations

import argparse
import asyncio
import copy
import sqlite3
import sys
import tempfile
import time
import timeit
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import yaml
from pydantic import Field

from benchmarks.lib.cluster import apply_applications, serve_cluster
from benchmarks.lib.config import BenchConfig
from benchmarks.lib.goals import GoalRecord, goal
from deployments.config import PROJECT_ROOT
from deployments.config.security import KeyBudget
from deployments.config.state import StateConfig
from deployments.errors import BudgetExceededError, BudgetUnverifiableError
from deployments.ingress.protocol import ChatCompletionRequest
from deployments.ingress.security import (
    KeyStore,
    Principal,
    RateLimiter,
    RateLimits,
    SecurityConfig,
    check_chat,
    estimate_chat_tokens,
)
from deployments.ingress.state.budgets import SpendAdmission
from deployments.ingress.state.gateway import GatewayState
from deployments.ingress.state.leases import BudgetLeases
from deployments.ingress.state.request_log import RequestRecord
from deployments.ingress.state.spend import KeySpend, period_of
from deployments.ingress.state.sqlite import SqliteDatabase
from deployments.observability import ModelPrice
from deployments.serve_file import set_router_listener
from edgectl.loadtest.summary import latency_stats_s
from edgectl.local_cluster import free_port

NEEDS_RAY = True  # the moderation gate's latency; the admission cost runs anywhere

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


LEASE_BUDGET = 100.0  # cost units per key; every request costs 1 (its estimate too)
LEASE_PACE_S = 0.005  # between rounds of one request per key per router
RECONCILE_GOAL_S = 10.0


def _record(key_id: str, admission: SpendAdmission, now: float) -> RequestRecord:
    return RequestRecord(
        ts=now, day="", request_id=None, key_id=key_id, endpoint="/v1/chat/completions",
        model="bench", region=None, colo=None, route_reason=None, status=200, stream=False,
        input_tokens=1, output_tokens=1, cost_units=admission.reserved_cost_units,
        latency_ms=1.0, ttft_ms=None, cold_start_ms=None, cache=None, error_type=None,
        budget_period=admission.period, reserved_cost_units=admission.reserved_cost_units,
    )  # fmt: skip


def _leases(state: GatewayState) -> BudgetLeases:
    assert state.budgets.leases is not None, "budget leases are the shipped default"
    return state.budgets.leases


def budget_lease_outage(keys: int, routers: int, outage_s: float) -> dict[str, Any]:
    """`routers` router replicas' gateway state (as shipped: budget leases) on one SQLite file,
    `keys` keys of budget LEASE_BUDGET, a request per key and router every LEASE_PACE_S; another
    writer holds SQLite's lock for `outage_s`. Per key: the leases out when it took the lock,
    what was admitted meanwhile, refusals while a lease still held the request (goal 0) and the
    overspend once settled (goal <= leases out); the seconds from the lock's release until every
    record is written (goal <= RECONCILE_GOAL_S)."""
    return asyncio.run(_lease_outage(keys, routers, outage_s))


async def _lease_outage(keys: int, routers: int, outage_s: float) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    principals = [
        Principal(f"key-{n}", RateLimits(), budget=KeyBudget(cost_units=LEASE_BUDGET))
        for n in range(keys)
    ]
    period = period_of("month", time.time())[0]
    admitted: Counter[str] = Counter()
    refused_in_lease: Counter[str] = Counter()

    async def serve(state: GatewayState, principal: Principal, outage: bool) -> None:
        held = _leases(state).lease_of(principal.key_id, period)
        try:
            admission = await state.budgets.admit(principal, "bench", 1, 1)
        except BudgetUnverifiableError:
            refused_in_lease[principal.key_id] += held >= 1
            return
        except BudgetExceededError:
            return
        admitted[principal.key_id] += outage
        state.writer.offer(_record(principal.key_id, admission, time.time()))

    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "gateway.sqlite3"
        prices = {"bench": ModelPrice(per_request=1.0)}
        states = [
            GatewayState.build(StateConfig(), SqliteDatabase(path, 0.05), SecurityConfig(), prices)
            for _ in range(routers)
        ]
        for state in states:
            assert await state.ensure_ready()
            state.start()
        for state in states:  # the keys are active: each router holds a lease of each
            for principal in principals:
                await serve(state, principal, outage=False)
            await _leases(state).top_ups_done()
        leases_out = {
            p.key_id: sum(_leases(s).lease_of(p.key_id, period) for s in states) for p in principals
        }
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        ends = loop.time() + outage_s
        while loop.time() < ends:
            for state in states:
                for principal in principals:
                    await serve(state, principal, outage=True)
            await asyncio.sleep(LEASE_PACE_S)
        blocker.execute("ROLLBACK")
        blocker.close()
        released = loop.time()
        while any(s.writer.held or _leases(s).unsettled for s in states):
            await asyncio.sleep(0.01)
        reconcile_s = loop.time() - released
        spend = await KeySpend(states[0].database).of_period({p.key_id: period for p in principals})
        for state in states:
            await state.close()  # the leases go back
        after = await _spend_after(path, principals, period)
    per_key = {
        key: {
            "leases_out": round(leases_out[key], 6),
            "admitted_during_outage": admitted[key],
            "refused_while_lease_held": refused_in_lease[key],
            "spent": spend[key].spent,
            "overspend": max(0.0, spend[key].spent - LEASE_BUDGET),
            "reserved_after_stop": round(after[key], 9) + 0.0,  # never -0.0
        }
        for key in leases_out
    }
    return {
        "keys": keys,
        "routers": routers,
        "outage_s": outage_s,
        "budget_per_key": LEASE_BUDGET,
        "per_key": per_key,
        "refused_while_lease_held": sum(refused_in_lease.values()),
        "max_admitted_beyond_leases_out": max(
            v["admitted_during_outage"] - v["leases_out"] for v in per_key.values()
        ),
        "max_overspend_beyond_leases_out": max(
            v["overspend"] - v["leases_out"] for v in per_key.values()
        ),
        "reconcile_s": round(reconcile_s, 3),
    }


def lease_goals(outage: dict[str, Any]) -> dict[str, GoalRecord]:
    """The issue's goals for budget leases through an outage."""
    return {
        "budget_lease_refused_within_leases": goal(
            outage.get("refused_while_lease_held"), 0, "requests", at_most=True
        ),
        "budget_lease_admitted_beyond_leases_out": goal(
            outage.get("max_admitted_beyond_leases_out"), 0, "cost units (worst key)", at_most=True
        ),
        "budget_lease_overspend_beyond_leases_out": goal(
            outage.get("max_overspend_beyond_leases_out"), 0, "cost units (worst key)", at_most=True
        ),
        "budget_lease_reconcile_s": goal(
            outage.get("reconcile_s"), RECONCILE_GOAL_S, "s after the database's return",
            at_most=True,
        ),
    }  # fmt: skip


async def _spend_after(path: Path, principals: list[Principal], period: str) -> dict[str, float]:
    database = SqliteDatabase(path)
    try:
        found = await KeySpend(database).of_period({p.key_id: period for p in principals})
    finally:
        await database.close()
    return {key: spend.reserved for key, spend in found.items()}


class SecurityBenchConfig(BenchConfig):
    QUICK = {"admission_repetitions": 2_000, "gate_requests": 20, "lease_outage_s": 1.0}

    admission_repetitions: int = Field(default=20_000, ge=1)
    gate_requests: int = Field(default=80, ge=1, description="chat requests per gate setting")
    lease_keys: int = Field(default=10, ge=1)
    lease_routers: int = Field(default=3, ge=1)
    lease_outage_s: float = Field(default=60.0, gt=0, description="SQLite locked this long")


def run(args: argparse.Namespace) -> dict[str, Any]:
    config = SecurityBenchConfig.from_args(args)
    admission = admission_cost_us(repeat=config.admission_repetitions)
    print(f"security: admission {admission}", file=sys.stderr)
    leases = budget_lease_outage(config.lease_keys, config.lease_routers, config.lease_outage_s)
    print(f"security: budget leases {lease_goals(leases)}", file=sys.stderr)
    gate = gate_latency(config.gate_requests, config.models_dir)
    return {
        "config": config.model_dump(mode="json"),
        "admission": admission,
        "budget_lease_outage": leases,
        "moderation_gate": gate,
        "goals": lease_goals(leases),
    }
