"""`edge_sim` is the simulated world only: importing every one of its modules pulls in neither
Ray nor an HTTP, terminal or plotting library (those belong to `deployments` and `edgectl`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = ("ray", "httpx", "httpx_sse", "starlette", "fastapi", "aiohttp", "requests",
             "urllib3", "rich", "matplotlib")  # fmt: skip

# Run in a fresh interpreter: this test process has imported half the world already.
PROBE = """
import importlib, json, pkgutil, sys
import edge_sim
names = [m.name for m in pkgutil.walk_packages(edge_sim.__path__, "edge_sim.")]
for name in names:
    importlib.import_module(name)
loaded = sorted({m.split(".")[0] for m in sys.modules})
print(json.dumps({"modules": names, "loaded": loaded}))
"""


def test_importing_every_edge_sim_module_imports_no_ray_or_http() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout)
    assert {"edge_sim.network", "edge_sim.routing", "edge_sim.faults"} <= set(found["modules"])
    assert not [name for name in found["modules"] if "loadgen" in name or name.endswith(".ops")]
    assert sorted(set(FORBIDDEN) & set(found["loaded"])) == []
