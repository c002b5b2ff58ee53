"""What the planner reads from a serve_config.yaml: the edge section (colos, regions, routing),
the router's failover and cold-start settings, each model's GPU share (its cost per replica-
second) and every `<model>-<region>` deployment's autoscaling_config and queue limits. Keep-warm
schedules (`policy: deployments.control.keep_warm:KeepWarm`) become the planner's floor policy."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from deployments.config import ConfigError, parse_app_config
from deployments.control.keep_warm import KEEP_WARM_POLICY, KeepWarmConfig
from edge_sim.plan.autoscaler import PoolSpec
from edge_sim.plan.simulator import SimSettings
from edge_sim.regions import deployment_name

APP_IMPORT_PATH = "deployments.app:build_app"


@dataclass(frozen=True)
class ServePlanConfig:
    edge: Any  # edge_sim.config.EdgeConfig
    models: tuple[str, ...]
    specs: dict[tuple[str, str], PoolSpec]
    keep_warm: dict[tuple[str, str], KeepWarmConfig]
    failover_attempts: int
    default_cold_start_ms: float
    gpu_per_replica: dict[str, float]

    def settings(self, **overrides: Any) -> SimSettings:
        """Simulation settings from this config, with the planner's own knobs overridden."""
        fields: dict[str, Any] = {
            "failover_attempts": self.failover_attempts,
            "default_cold_start_ms": self.default_cold_start_ms,
            "gpu_per_replica": dict(self.gpu_per_replica),
        }
        fields.update(overrides)
        return SimSettings(**fields)


def load_serve_config(path: str | Path) -> ServePlanConfig:
    """Raises ConfigError naming the file and the field."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(f"{path}: {error}") from None
    apps = [
        a for a in (raw or {}).get("applications", []) if a.get("import_path") == APP_IMPORT_PATH
    ]
    if not apps:
        raise ConfigError(f"{path}: no application with import_path {APP_IMPORT_PATH}")
    app = apps[0]
    config = parse_app_config(app.get("args") or {})
    edge = config.edge
    models = tuple(config.models)
    regions = edge.region_names
    by_name: dict[str, Mapping[str, Any]] = {d["name"]: d for d in app.get("deployments", [])}
    specs: dict[tuple[str, str], PoolSpec] = {}
    keep_warm: dict[tuple[str, str], KeepWarmConfig] = {}
    for model in models:
        for region in regions:
            raw_spec = dict(by_name.get(deployment_name(model, region), {}))
            try:
                specs[(model, region)] = PoolSpec.model_validate(raw_spec)
            except ValueError as error:
                raise ConfigError(
                    f"{path}: deployment {deployment_name(model, region)}: {error}"
                ) from None
            policy = (raw_spec.get("autoscaling_config") or {}).get("policy") or {}
            if policy.get("policy_function") == KEEP_WARM_POLICY:
                keep_warm[(model, region)] = KeepWarmConfig.model_validate(
                    policy.get("policy_kwargs") or {}
                )
    return ServePlanConfig(
        edge=edge,
        models=models,
        specs=specs,
        keep_warm=keep_warm,
        failover_attempts=config.router.failover_attempts,
        default_cold_start_ms=config.router.default_cold_start_ms,
        gpu_per_replica={m: float(c.num_gpus or 1.0) for m, c in config.models.items()},
    )


class KeepWarmFloor:
    """The deployments' KeepWarm schedules as the planner's floor policy; t = 0 is `start`."""

    def __init__(self, schedules: Mapping[tuple[str, str], KeepWarmConfig], start: datetime):
        self.interval_s = 60.0
        self._schedules = dict(schedules)
        self._start = start if start.tzinfo else start.replace(tzinfo=UTC)

    def floors(self, now_s: float, demand: Mapping[tuple[str, str], int]) -> dict:
        instant = self._start + timedelta(seconds=now_s)
        return {
            key: c.floor_at(instant) for key, c in self._schedules.items() if c.floor_at(instant)
        }
