"""The shipped serve_config.yaml with its regions, cut to the models a region test needs, on a
cluster of the test's own (edgectl.local_cluster): deployed with `serve deploy`, read back with
`serve status` and /admin/regions, as an operator would."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from deployments.config import serve_only
from edgectl.loadtest.regions import CITY_PROBES
from edgectl.local_cluster import LocalCluster, free_port, wait_until

REPO = Path(__file__).resolve().parents[2]
ADMIN_KEY = "test-admin-key"
LOAD_KEY = "sk-load-0000"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
LOAD = {"authorization": f"Bearer {LOAD_KEY}"}
CLUSTER_ENV = {
    "EDGE_ADMIN_KEY": ADMIN_KEY,
    "EDGE_API_KEYS": f"load:{LOAD_KEY}",
    # A killed node is declared dead after 3 missed 1 s health checks, not Ray's default 5 x 3 s.
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}
# Cities and the region each is nearest to (through its nearest colo) in the shipped config.


def region_config(
    models_root: Path,
    http_port: int,
    models: Mapping[str, Mapping[str, int]],
    deployment_options: Mapping[str, Any] | None = None,
    ingress_resource: str | None = None,
) -> dict[str, Any]:
    """serve_config.yaml serving only `models` ({model: {region: initial replicas}}), one
    replica per region at most, replicas kept for 10 minutes, the gate off, RTT not slept."""
    config = yaml.safe_load((REPO / "serve_config.yaml").read_text())
    config["http_options"] = {"host": "127.0.0.1", "port": http_port}
    app = config["applications"][0]
    args = app["args"]
    args["models_dir"] = str(models_root)
    serve_only(args, models)
    args["security"]["moderation_gate"]["models"] = []
    args["security"]["per_key"] = {"load": {"requests_per_minute": None, "tokens_per_minute": None}}
    args["edge"]["latency"]["real_delay_scale"] = 0
    if ingress_resource is not None:
        args["edge"]["region_policy"]["ingress_resource"] = ingress_resource
    deployments = []
    for deployment in app["deployments"]:
        model, _, region = deployment["name"].rpartition("-")
        if model in models:
            deployment = copy.deepcopy(deployment)
            scaling = deployment["autoscaling_config"]
            scaling.update(max_replicas=1, initial_replicas=models[model][region])
            scaling.update(downscale_delay_s=600, downscale_to_zero_delay_s=600)
            deployment.update((deployment_options or {}).get(model, {}))
            deployments.append(deployment)
        elif deployment["name"] == "router":
            deployments.append(deployment)
    app["deployments"] = deployments
    return config


@dataclass
class RegionApp:
    ray: LocalCluster
    base_url: str
    config_path: Path

    def deploy(self, config: dict[str, Any]) -> None:
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.ray.serve_deploy(self.config_path, attempts=3)  # the first deploy starts Serve
        wait_until(
            lambda: self.status()["status"] == "RUNNING", 300, "the edge app RUNNING", every_s=2
        )
        wait_until(
            lambda: httpx.get(f"{self.base_url}/healthz", timeout=5).status_code == 200,
            60,
            "the router to answer",
        )

    def status(self) -> dict[str, Any]:
        return dict(yaml.safe_load(self.ray.cli("serve", "status"))["applications"]["edge"])

    def running(self, deployment: str) -> int:
        replicas = self.status()["deployments"][deployment]["replica_states"]
        return int(replicas.get("RUNNING", 0))

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=120, headers=LOAD)

    def regions(self) -> dict[str, dict[str, Any]]:
        """/admin/regions by region name."""
        with self.client() as http:
            listed = http.get("/admin/regions", headers=ADMIN).json()
        return {entry["region"]: entry for entry in listed}


def running_app(ray: LocalCluster, config_dir: Path, config: dict[str, Any]) -> Iterator[RegionApp]:
    port = config["http_options"]["port"]
    app = RegionApp(ray, f"http://127.0.0.1:{port}", config_dir / "serve_config.yaml")
    app.deploy(config)
    yield app


def embed(http: httpx.Client, city: str, model: str = "embedding") -> httpx.Response:
    """One uncached request from `city` (see CITY_PROBES)."""
    geo, _ = CITY_PROBES[city]
    return http.post(
        "/v1/embeddings",
        json={"model": model, "input": f"hello from {city}"},
        headers={"x-client-geo": geo, "x-edge-cache": "bypass"},
    )


__all__ = ["CITY_PROBES", "free_port", "wait_until"]
