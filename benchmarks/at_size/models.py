"""The at-size models the suite serves: built once (`deployments.export large`) or reused, our
application serving them beside the shipped defaults, and vLLM's side on the same checkpoints."""

from __future__ import annotations

import copy
import json
import logging
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.at_size.config import INT8, AtSizeBenchConfig
from benchmarks.lib.edge_app import our_application
from deployments.export.at_size import CHECKPOINTS

log = logging.getLogger(__name__)

# The moderation gate, prices and the rest follow the shipped model an export stands in for.
GATED_MODELS = ("glm", "kimi")


def ensure_built(config: AtSizeBenchConfig) -> dict[str, Any]:
    """Build the exports the suite serves where they are missing (a full build takes minutes and
    GBs: reused when present); returns what was built and what was reused."""
    missing = [name for name in config.exports() if not _built(config, name)]
    if missing:
        from deployments.export.at_size import build_large

        root = config.model_dir(missing[0]).parent
        log.info("building at-size %s into %s (layers: %s)", missing, root, config.layers)
        build_large(root, config.layers, missing)
    return {"root": str(config.model_dir(config.models[0]).parent), "built": missing}


def _built(config: AtSizeBenchConfig, name: str) -> bool:
    model_dir = config.model_dir(name)
    if not (model_dir / "manifest.json").is_file():
        return False
    layers = json.loads((model_dir / "config.json").read_text())["num_hidden_layers"]
    return config.layers is None or layers == config.layers


def checkpoint_dir(config: AtSizeBenchConfig, model: str) -> Path:
    return config.model_dir(model).parent / CHECKPOINTS / model


def at_size_application(config: AtSizeBenchConfig) -> dict[str, Any]:
    """serve_config.yaml's application as the served suites deploy it, its glm and kimi pointing
    at the at-size exports (each int8 export a model of its own beside), at `config.threads`."""
    app = our_application(config)
    models = app["args"]["models"]
    by_name = {d["name"]: d for d in app["deployments"]}
    for model in config.models:
        point_at_export(config, models, model)
        int8 = INT8.get(model)
        if int8 is not None:
            models[int8] = {
                **models[model],
                "model_dir": str(config.model_dir(int8)),
                "aliases": [],
            }
            app["deployments"].append({**copy.deepcopy(by_name[model]), "name": int8})
            _follow(app["args"], model, int8)
    return app


def point_at_export(config: AtSizeBenchConfig, models: dict[str, Any], model: str) -> None:
    """`model`'s entry of an application's `models` serving its at-size export, at
    `config.threads`."""
    models[model] = {
        **models[model],
        "model_dir": str(config.model_dir(model)),
        "intra_op_threads": config.threads,
    }


def _follow(args: dict[str, Any], model: str, export: str) -> None:
    """`export` gated and priced as `model` is."""
    gate = args["security"]["moderation_gate"]
    if model in gate.get("models", []):
        gate["models"] = [*gate["models"], export]
    prices = args.get("observability", {}).get("prices", {})
    if model in prices:
        prices[export] = prices[model]


@dataclass(frozen=True)
class VllmRow:
    """One comparison with vLLM: its dtype, and which of our exports it is measured against."""

    name: str  # "fp32" or "best"
    dtype: str
    ours: tuple[str, ...]


def vllm_rows(model: str) -> list[VllmRow]:
    """fp32 against fp32 (and, where there is one, our int8 against vLLM's fp32: the 3x goal),
    then each side's best dtype: vLLM's bfloat16, our int8 where built, else our fp32."""
    int8 = INT8.get(model)
    return [
        VllmRow("fp32", "float32", (model, int8) if int8 else (model,)),
        VllmRow("best", "bfloat16", (int8 or model,)),
    ]


def vllm_args(row: VllmRow) -> list[str]:
    # Its own docs' CPU advice: a KV space in GiB (VLLM_CPU_KVCACHE_SPACE, in vllm_env), not a
    # share of memory; up to 32 sequences so 16 concurrent requests run in one batch.
    return ["--dtype", row.dtype, "--max-num-seqs", "32"]


def vllm_env(config: AtSizeBenchConfig) -> dict[str, str]:
    """vLLM's CPU settings as its docs advise for a machine with no core to spare: every core for
    compute (VLLM_CPU_NUM_OF_RESERVED_CPU=0; the default reserves one for the server), threads
    bound to them (VLLM_CPU_OMP_THREADS_BIND=auto), the KV cache's space in GiB."""
    return {
        "VLLM_CPU_KVCACHE_SPACE": str(config.vllm_kv_space_gib),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_CPU_OMP_THREADS_BIND": "auto",
    }


def vllm_build(python: Path) -> dict[str, Any]:
    """vLLM's version and build (its distribution and torch's), for the report."""
    code = (
        "import importlib.metadata as m, json, torch, vllm; "
        "print(json.dumps({'vllm': vllm.__version__, 'torch': torch.__version__, "
        "'distribution': [d.metadata['Name'] for d in m.distributions() "
        "if d.metadata['Name'].startswith('vllm')], 'torch_config': torch.__config__.show()}))"
    )
    try:
        done = subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, timeout=300, check=True
        )
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def cpu_flags() -> list[str]:
    """The CPU's feature flags (/proc/cpuinfo): which kernels either side can use."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return sorted(line.split(":", 1)[1].split())
    except OSError:
        pass
    return []
