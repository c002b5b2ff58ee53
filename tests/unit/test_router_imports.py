"""The router's import path stays light: it reads the runtime's wire types (what a replica is asked
and answers) and never loads the engines behind them, ONNX Runtime or torch. Each import runs in a
fresh interpreter, so what this test process already loaded cannot hide a heavy import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Heavy packages the router must not load: the model graphs, the grammar engine, the tokenizers.
HEAVY_PACKAGES = ("onnxruntime", "torch", "transformers", "llguidance", "tokenizers")
# The runtime modules the router may load: plain data that crosses a Ray call (its answers'
# types, the sampling and generation options it builds, the session settings the app checks).
RUNTIME_WIRE_MODULES = {
    "deployments.runtime",
    "deployments.runtime.chat_features",
    "deployments.runtime.encoder_outputs",
    "deployments.runtime.manifest",
    "deployments.runtime.outputs",
    "deployments.runtime.sampling_params",
    "deployments.runtime.session_config",
    "deployments.runtime.tool_calls",
}


def loaded_after(module: str) -> set[str]:
    """The names in sys.modules after importing `module` in a new interpreter."""
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.parametrize(
    "module",
    [
        "deployments.config",
        "deployments.api",
        "deployments.api.app",
        "deployments.router",
        # Serve loads a chat pool's request router in the process of every handle to it
        "deployments.servers.session_router",
    ],
)
def test_the_router_import_path_loads_no_engine(module: str) -> None:
    loaded = loaded_after(module)
    assert module in loaded
    heavy = {name for name in loaded if name.split(".")[0] in HEAVY_PACKAGES}
    assert not heavy, f"{module} loads {sorted(heavy)}"
    runtime = {name for name in loaded if name.startswith("deployments.runtime")}
    assert runtime <= RUNTIME_WIRE_MODULES, (
        f"{module} loads engine modules {sorted(runtime - RUNTIME_WIRE_MODULES)}"
    )


def test_the_check_sees_what_a_chat_replica_loads() -> None:
    """The same check on the chat replica's module finds the engine: it can fail."""
    loaded = loaded_after("deployments.servers.chat")
    assert {"onnxruntime", "deployments.runtime.llm"} <= loaded
