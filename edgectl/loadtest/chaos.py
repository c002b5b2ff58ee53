"""The chaos scenario: steady mixed load (embeddings, moderation, chat streams, chat whole answers)
entering at one worker node's ingress of an edgectl.ha_cluster cluster, while one fault after
another is injected as a real crash (SIGKILL), each in a window of its own: `before`, the kill,
`during`, `after`; the last "fault" is an operator's `serve deploy` of a changed config. The
report is the load tester's (summary.json, CSVs, plots, kills marked) plus faults.json: per fault
sent, ok, failed (non-streaming; streams cut apart), p99 before/during/after, and how long until
requests stopped failing.

It needs the cluster it kills: `edge loadtest chaos` starts one of its own (`main`); the tests
pass theirs to `run_chaos`."""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from edgectl.ha_cluster import HaCluster, ha_serve_config
from edgectl.loadtest.records import RequestRecord
from edgectl.loadtest.regions import region_named
from edgectl.loadtest.report import write_outputs
from edgectl.loadtest.runner import AdminEvent, LoadRunner, RunResult, RunSettings
from edgectl.loadtest.scenarios import ModelTarget, Phase, ScenarioConfig, build_schedule
from edgectl.loadtest.summary import error_label, latency_stats
from edgectl.loadtest.workload import WorkloadSettings
from edgectl.local_cluster import RayNode, wait_until
from edgectl.netns import NetworkUnavailable, check_available
from edgectl.small_config import LOAD_KEY_NAME

# What can be killed, in the order a full run kills them. A restart of what the kill took down
# (the head, a worker node, Redis) is part of the fault: "after" is the healed cluster.
FAULTS = (
    "model-replica",
    "router-replica",
    "ingress",
    "edge-control",
    "serve-controller",
    "gcs",
    "head",
    "worker-node",
    "redis",
    "redeploy",
)
ENTRY_NODE = "us"  # clients enter here; the other worker ("ap") takes the node-level faults
OTHER_NODE = "ap"
CLIENT_REGION = "na-east"  # New York: served from us, failing over to ap or eu
FAULTS_JSON = "faults.json"
GCS_GIVES_UP_S = 60  # Redis killed: how long the GCS is given to exit (seen: about 8 s)


def fault_phases(faults: Sequence[str], window_s: float) -> tuple[Phase, ...]:
    """Three equal phases per fault, one fault after another: its kill starts `during`."""
    phases = []
    for index, fault in enumerate(faults):
        start, third = index * window_s, window_s / 3
        phases += [
            Phase(f"{fault}:before", start, start + third),
            Phase(f"{fault}:during", start + third, start + 2 * third),
            Phase(f"{fault}:after", start + 2 * third, start + window_s),
        ]
    return tuple(phases)


@dataclass(frozen=True)
class Injection:
    fault: str
    at_s: float  # since the run started
    done_s: float  # the kill and any restart it needs, done
    detail: str  # what was killed (pids, node), or why it could not be


class FaultInjector:
    """Each fault as a real crash of `cluster`'s processes, found by their process titles (Ray
    names an actor's worker `ray::<class>` / `ray::ServeReplica:<app>:<deployment>`)."""

    def __init__(self, cluster: HaCluster):
        self.cluster = cluster
        self.actions: dict[str, Callable[[], str]] = {
            "model-replica": lambda: self._kill_title(f"ServeReplica:edge:embedding-{ENTRY_NODE}"),
            "router-replica": lambda: self._kill_title("ServeReplica:edge:router", ENTRY_NODE),
            "ingress": self._kill_ingress,
            "edge-control": lambda: self._kill_title("ServeReplica:edge:edge-control"),
            "serve-controller": lambda: self._kill_title("ray::ServeController"),
            "gcs": self._kill_gcs,
            "head": lambda: self._kill_node(self.cluster.ray.head),
            "worker-node": lambda: self._kill_node(self.cluster.node(OTHER_NODE)),
            "redis": self._kill_redis,
            "redeploy": self._redeploy,
        }

    def inject(self, fault: str) -> str:
        return self.actions[fault]()

    def _kill_title(self, title: str, node_name: str | None = None) -> str:
        nodes = [self.cluster.node(node_name)] if node_name else self.cluster.ray.nodes
        for node in nodes:
            pids = node.pids(title)
            if pids:
                _kill(pids)
                return f"{title} on {node.name}: pid {pids}"
        return f"no {title} running"

    def _kill_ingress(self) -> str:
        # The ingress the clients do not enter at: clients of the killed one cannot be helped
        # (tests/integration/test_high_availability.py measures those).
        node = self.cluster.node(OTHER_NODE)
        return f"ingress on {node.name}: pid {self.cluster.kill_ingress(node)}"

    def _kill_gcs(self) -> str:
        head = self.cluster.ray.head
        pids = head.pids("gcs_server")
        _kill(pids)
        # `ray start --block` takes the head's other daemons down when one dies: a head pod
        # whose GCS crashed restarts whole too.
        head.process.wait(timeout=60)
        self.cluster.ray.restart_node(head)
        return f"gcs_server pid {pids}; the head restarted"

    def _kill_node(self, node: RayNode) -> str:
        self.cluster.ray.kill_node(node)
        self.cluster.ray.restart_node(node)
        return f"node {node.name} killed and restarted"

    def _kill_redis(self) -> str:
        """Redis killed and restarted (its append-only file kept). Ray's GCS exits when it loses
        its store, and the head with it: that head is restarted too, as KubeRay restarts a head
        pod."""
        self.cluster.redis.kill()
        self.cluster.redis.restart()
        head = self.cluster.ray.head
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: not head.alive, GCS_GIVES_UP_S, "the GCS to give up on Redis")
        if head.alive:
            return "redis-server killed and restarted; the GCS stayed up"
        self.cluster.ray.restart_node(head)
        return "redis-server killed and restarted; the GCS exited, the head restarted"

    def _redeploy(self) -> str:
        """Not a kill: `serve deploy` of the running config with an autoscaling change and a
        user_config change of the entry region's embedding deployment, as an operator's edit."""
        if self.cluster.deployed is None:
            return "nothing deployed to change"
        config, path = self.cluster.deployed
        changed = copy.deepcopy(config)
        (deployment,) = [
            d
            for d in changed["applications"][0]["deployments"]
            if d["name"] == f"embedding-{ENTRY_NODE}"
        ]
        scaling = deployment["autoscaling_config"]
        scaling["target_ongoing_requests"] = scaling.get("target_ongoing_requests", 2) * 2
        batch = deployment.setdefault("user_config", {}).get("max_batch_size", 32)
        deployment["user_config"]["max_batch_size"] = max(1, batch // 2)
        changed_path = path.with_name("serve_config.changed.yaml")
        changed_path.write_text(yaml.safe_dump(changed, sort_keys=False))
        self.cluster.ray.serve_deploy(changed_path)
        self.cluster.deployed = (changed, changed_path)
        return (
            f"serve deploy: embedding-{ENTRY_NODE} target_ongoing_requests "
            f"{scaling['target_ongoing_requests']}, max_batch_size "
            f"{deployment['user_config']['max_batch_size']}"
        )


def _kill(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def fault_summary(
    records: Sequence[RequestRecord],
    faults: Sequence[str],
    injections: Sequence[Injection],
    window_s: float,
) -> dict[str, Any]:
    """Per fault: what its window sent and how it went, p99 by phase (successful requests).
    Failures are split: `failed_in_flight` were sent before the kill (on the killed process, say,
    when it died), `failed_after` were sent after it. `recovered_s`: from the kill to the end of
    the last failed request that ended after it (0: none)."""
    phases = fault_phases(faults, window_s)
    by_fault: dict[str, Any] = {}
    for fault in faults:
        mine = [p for p in phases if p.name.startswith(f"{fault}:")]
        start, end = mine[0].start_s, mine[-1].end_s
        sent = [r for r in records if start <= r.scheduled_s < end]
        failed = [r for r in sent if not r.ok]
        injection = next((i for i in injections if i.fault == fault), None)
        kill_s = injection.at_s if injection else end
        ended_after = [r for r in failed if _ended_s(r) >= kill_s]
        recovered_s = max(_ended_s(r) for r in ended_after) - kill_s if ended_after else 0.0
        by_fault[fault] = {
            "sent": len(sent),
            "ok": len(sent) - len(failed),
            "failed": sum(not r.stream for r in failed),
            "streams_cut": sum(r.stream for r in failed),
            "failed_in_flight": sum(r.sent_s < kill_s for r in failed),
            "failed_after": sum(r.sent_s >= kill_s for r in failed),
            "errors": sorted({error_label(r) for r in failed}),
            "p99_ms": {
                phase.name.split(":")[1]: latency_stats(
                    r.latency_ms for r in sent if r.ok and _within(r, phase)
                )["p99"]
                for phase in mine
            },
            "recovered_s": round(recovered_s, 1),
            "injected": dataclasses.asdict(injection) if injection else None,
        }
    return by_fault


def _ended_s(record: RequestRecord) -> float:
    return record.scheduled_s + (record.latency_ms or 0.0) / 1000


def _within(record: RequestRecord, phase: Phase) -> bool:
    return phase.start_s <= record.scheduled_s < phase.end_s


def run_chaos(
    cluster: HaCluster,
    out_dir: Path,
    *,
    models: Sequence[ModelTarget],
    faults: Sequence[str] = FAULTS,
    window_s: float = 90.0,
    rate_rps: float = 4.0,
    stream_share: float = 0.5,
    api_key: str | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Run the scenario; write the report into `out_dir`; return its summary."""
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        raise ValueError(f"unknown faults {unknown}; known: {list(FAULTS)}")
    config = ScenarioConfig(
        scenario="steady",
        models=tuple(models),
        rate_rps=rate_rps,
        duration_s=window_s * len(faults),
        seed=seed,
        region=CLIENT_REGION,
    )
    schedule = dataclasses.replace(build_schedule(config), phases=fault_phases(faults, window_s))
    settings = RunSettings(
        base_url=cluster.ingress_url(cluster.node(ENTRY_NODE)),
        run_id="chaos",
        workload=WorkloadSettings(api_key=api_key, stream_share=stream_share),
    )
    injector = FaultInjector(cluster)
    injections: list[Injection] = []
    started = threading.Event()

    def inject_in_turn() -> None:
        started.wait()
        t0 = time.monotonic()
        for index, fault in enumerate(faults):
            kill_at = index * window_s + window_s / 3
            time.sleep(max(0.0, kill_at - (time.monotonic() - t0)))
            at_s = time.monotonic() - t0
            try:
                detail = injector.inject(fault)
            except Exception as error:  # noqa: BLE001 - reported in the run's summary
                detail = f"failed: {error!r}"[-1000:]  # a command's error ends with the cause
            injections.append(Injection(fault, at_s, time.monotonic() - t0, detail))

    thread = threading.Thread(target=inject_in_turn, daemon=True)
    thread.start()
    started.set()
    result = LoadRunner(settings).run(schedule)
    thread.join(timeout=600)
    result = _with_injections(result, injections)
    params = {
        "url": settings.base_url,
        "faults": list(faults),
        "window_s": window_s,
        "rate_rps": rate_rps,
        "stream_share": stream_share,
        "seed": seed,
        "entry": ENTRY_NODE,
        "client_region": region_named(CLIENT_REGION).city,
    }
    summary = write_outputs(result, out_dir, params)
    summary["faults"] = fault_summary(result.records, faults, injections, window_s)
    (out_dir / FAULTS_JSON).write_text(json.dumps(summary["faults"], indent=2, sort_keys=True))
    return summary


def _with_injections(result: RunResult, injections: Sequence[Injection]) -> RunResult:
    """The kills as the report's marked events (the plots draw a line at each)."""
    events = tuple(
        AdminEvent(i.at_s, i.at_s, f"kill {i.fault}", "KILL", i.fault, 0, i.detail)
        for i in injections
    )
    return dataclasses.replace(result, admin_events=(*result.admin_events, *events))


DEFAULT_MODELS = (
    ModelTarget(name="embedding", task="embedding"),
    ModelTarget(name="moderation", task="moderation"),
    ModelTarget(name="glm", task="chat"),
)


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="The chaos scenario on a highly available cluster of its own on this "
        "machine (needs root: network namespaces), with a report.",
    )
    add = parser.add_argument
    add("--serve-config", type=Path, default=Path("serve_config.yaml"))
    add("--models-dir", type=Path, default=Path("models"))
    add("--out", type=Path, default=Path("reports/chaos"))
    add("--faults", default=",".join(FAULTS), help="comma-separated, in order (default: all)")
    add("--window-s", type=float, default=90.0, help="per fault: before, during, after")
    add("--rate", type=float, default=4.0, help="requests/s, all models together")
    add("--stream-share", type=float, default=0.5, help="share of chat requests that stream")
    add("--seed", type=int, default=0)
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "edge loadtest chaos") -> int:
    args = build_parser(prog).parse_args(argv)
    faults = [fault for fault in args.faults.split(",") if fault]
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        print(f"{prog}: unknown faults {unknown}; known: {', '.join(FAULTS)}", file=sys.stderr)
        return 2
    try:
        check_available()
    except NetworkUnavailable as missing:
        print(f"{prog}: {missing}", file=sys.stderr)
        return 2
    load_key = f"sk-chaos-{secrets.token_hex(8)}"
    env = {"EDGE_API_KEYS": f"{LOAD_KEY_NAME}:{load_key}"}
    cluster = HaCluster.start(env=env)
    try:
        config = ha_serve_config(args.serve_config, args.models_dir.resolve())
        args.out.mkdir(parents=True, exist_ok=True)
        cluster.deploy(config, args.out / "serve_config.yaml")
        summary = run_chaos(
            cluster,
            args.out,
            models=DEFAULT_MODELS,
            faults=faults,
            window_s=args.window_s,
            rate_rps=args.rate,
            stream_share=args.stream_share,
            api_key=load_key,
            seed=args.seed,
        )
    finally:
        cluster.stop()
    for fault, outcome in summary["faults"].items():
        p99 = outcome["p99_ms"]
        print(
            f"{fault:17} sent {outcome['sent']:4} ok {outcome['ok']:4} failed "
            f"{outcome['failed']:3} streams cut {outcome['streams_cut']:3} p99 ms "
            f"{p99['before']}/{p99['during']}/{p99['after']} recovered {outcome['recovered_s']} s"
        )
    print(f"report: {args.out}")
    return 0
