"""The one disruption that is not a kill: an operator's `serve deploy` of a changed config under
load. The change is to the router's arguments (`router.default_cold_start_ms`), which the routers
and edge-control are built with, so Serve replaces those replicas one by one (a rolling update):
each old replica drains while the front door sends new requests to the others."""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from benchmarks.atrest.serve_run import REPO, SERVE, ServeRun
from benchmarks.front_door.victims import Victim

DEPLOY_TIMEOUT_S = 120.0


def changed_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` with every application's `router.default_cold_start_ms` one millisecond longer:
    new arguments for the routers and edge-control, nothing a request would notice."""
    changed = copy.deepcopy(dict(config))
    for app in changed["applications"]:
        router = app["args"].setdefault("router", {})
        router["default_cold_start_ms"] = float(router.get("default_cold_start_ms", 3000)) + 1
    return changed


def serve_deploy(running: ServeRun, config: Mapping[str, Any], workdir: Path) -> Victim:
    """`serve deploy` of `changed_config(config)` on the suite's cluster (its dashboard address
    is in the cluster's environment), as an operator runs it from a shell. The Victim is the
    `serve deploy` process, its pid None when the deploy failed (a miss saying so)."""
    path = workdir / "serve_config.changed.yaml"
    path.write_text(yaml.safe_dump(changed_config(config), sort_keys=False))
    with subprocess.Popen(
        [str(SERVE), "deploy", str(path)],
        cwd=REPO,
        env=running.cluster.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as deploy:
        output, _ = deploy.communicate(timeout=DEPLOY_TIMEOUT_S)
    if deploy.returncode != 0:
        return Victim("serve-deploy", None, f"serve deploy failed: {output[-300:]}")
    return Victim("serve-deploy", deploy.pid, "serve deploy (new router arguments)")
