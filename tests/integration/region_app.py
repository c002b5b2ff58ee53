"""The shipped serve_config.yaml with its regions, cut to the models a region test needs, on a
cluster of the test's own (edgectl.local_cluster): deployed with `serve deploy`, read back with
`serve status` and /admin/regions, as an operator would."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from edgectl.loadtest.regions import CITY_PROBES
from edgectl.local_cluster import LocalCluster, free_port, wait_until
from edgectl.small_config import LOAD_KEY_NAME, regional_config

REPO = Path(__file__).resolve().parents[2]
ADMIN_KEY = "test-admin-key"
LOAD_KEY = "sk-load-0000"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
LOAD = {"authorization": f"Bearer {LOAD_KEY}"}
CLUSTER_ENV = {
    "EDGE_ADMIN_KEY": ADMIN_KEY,
    "EDGE_API_KEYS": f"{LOAD_KEY_NAME}:{LOAD_KEY}",
    # A killed node is declared dead after 3 missed 1 s health checks, not Ray's default 5 x 3 s.
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}
# A client waits longer than the router's own deadline across failovers (request_timeout_s).
REQUEST_TIMEOUT_S = 150


def region_config(
    models_root: Path,
    http_port: int,
    models: Mapping[str, Mapping[str, int]],
    deployment_options: Mapping[str, Any] | None = None,
    ingress_resource: str | None = None,
) -> dict[str, Any]:
    """The shipped serve_config.yaml serving only `models` (edgectl.small_config)."""
    return regional_config(
        REPO / "serve_config.yaml",
        models_root,
        http_port,
        models,
        deployment_options,
        ingress_resource,
    )


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

    def every_city_served_from_its_region(self, times: int = 8) -> bool:
        """Each city's uncached request answered from its nearest region `times` in a row: the
        router replicas (each learns of a warm region on its own next sync) all see every region
        warm, so a load started now is routed by distance alone."""
        with self.client() as http:
            return all(
                embed(http, city).headers.get("x-edge-region") == region
                for city, (_, region) in CITY_PROBES.items()
                for _ in range(times)
            )

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


@dataclass
class Answer:
    sent_at: float  # monotonic
    city: str
    status: int
    region: str | None
    took_s: float = 0.0


@dataclass
class MixedLoad:
    """One client per city (`entry_urls`: city -> the ingress it enters at), one uncached
    embeddings request after another each, until stopped."""

    entry_urls: Mapping[str, str]
    answers: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    @classmethod
    def everywhere(cls, base_url: str) -> MixedLoad:
        """A client in every city of CITY_PROBES, all entering at `base_url`."""
        return cls({city: base_url for city in CITY_PROBES})

    def start(self) -> None:
        for city in self.entry_urls:
            thread = threading.Thread(target=self._client, args=(city,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=150)

    def from_city(self, city: str, since: float) -> list[Answer]:
        return [a for a in list(self.answers) if a.city == city and a.sent_at >= since]

    def _client(self, city: str) -> None:
        geo, _ = CITY_PROBES[city]
        headers = {**LOAD, "x-client-geo": geo, "x-edge-cache": "bypass"}
        body = {"model": "embedding", "input": f"hello from {city}"}
        with httpx.Client(base_url=self.entry_urls[city], timeout=REQUEST_TIMEOUT_S) as client:
            while not self._stop.is_set():
                sent_at = time.monotonic()
                try:
                    response = client.post("/v1/embeddings", json=body, headers=headers)
                    answer = Answer(
                        sent_at,
                        city,
                        response.status_code,
                        response.headers.get("x-edge-region"),
                        time.monotonic() - sent_at,
                    )
                except httpx.HTTPError:
                    answer = Answer(sent_at, city, 0, None, time.monotonic() - sent_at)
                self.answers.append(answer)
                time.sleep(0.2)


def embed(http: httpx.Client, city: str, model: str = "embedding") -> httpx.Response:
    """One uncached request from `city` (see CITY_PROBES)."""
    geo, _ = CITY_PROBES[city]
    return http.post(
        "/v1/embeddings",
        json={"model": model, "input": f"hello from {city}"},
        headers={"x-client-geo": geo, "x-edge-cache": "bypass"},
    )


__all__ = ["CITY_PROBES", "free_port", "wait_until"]
