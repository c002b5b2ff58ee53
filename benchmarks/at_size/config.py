"""The at-size suite's settings and options."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any

from pydantic import Field

from benchmarks.atrest.config import ColdCycleSettings
from benchmarks.lib.config import PeeredBenchConfig

DEFAULT_AT_SIZE_DIR = Path("models-large")  # where `make models-large` builds them
AT_SIZE_MODELS = ("glm", "kimi")
INT8 = {"glm": "glm-int8"}  # the int8 export of a model, where `large` builds one


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class AtSizeBenchConfig(PeeredBenchConfig, ColdCycleSettings):
    # Quick: the stand-ins cut to 2 layers (full width, real vocabulary: built in seconds), GLM
    # alone, one run, short answers.
    QUICK = {
        "layers": 2,
        "models": ["glm"],
        "runs": 1,
        "max_tokens": 8,
        "ttft_streams": 2,
        "settle_s": 0.1,
        "stream_tokens": 48,
        "lead_s": 0.5,
        "agreement_prompts": 2,
        "agreement_tokens": 4,
        "gemm_repeats": 3,
        "cold_cycles": 2,
    }

    at_size_dir: Path = DEFAULT_AT_SIZE_DIR
    layers: int | None = Field(default=None, ge=1, description="None: the stand-ins' own depth")
    models: list[str] = Field(default=list(AT_SIZE_MODELS), min_length=1)
    runs: int = Field(default=5, ge=1, description="alternating runs per side; goals on medians")
    streams: int = Field(default=16, ge=1, description="concurrent requests per burst")
    max_tokens: int = Field(default=64, ge=2, description="new tokens per timed request")
    ttft_streams: int = Field(default=5, ge=1, description="single streams per side and run")
    # vLLM's threads spin on after a burst (the chat suite measured 1.2 CPU-seconds): each timed
    # part follows this much idle, on both sides alike.
    settle_s: float = Field(default=2.0, ge=0)
    threads: int = Field(
        default_factory=usable_cpus,
        ge=1,
        description="ONNX Runtime threads of the at-size replicas: every usable core, as vLLM "
        "takes them (the shipped one thread per replica suits the tiny defaults)",
    )
    # The decode stall: `running_streams` streams of `stream_tokens`, and `lead_s` after they
    # start a prompt of `prefill_tokens` arrives.
    running_streams: int = Field(default=8, ge=1)
    stream_tokens: int = Field(default=256, ge=8)
    prefill_tokens: int = Field(default=1500, ge=16)
    lead_s: float = Field(default=2.0, ge=0)
    agreement_prompts: int = Field(default=16, ge=1)
    agreement_tokens: int = Field(default=32, ge=1)
    gemm_repeats: int = Field(default=20, ge=1)
    vllm_python: Path | None = Field(default=None, description="vLLM's interpreter; None: skip")
    vllm_kv_space_gib: int = Field(default=4, ge=1, description="VLLM_CPU_KVCACHE_SPACE")
    vllm_start_timeout_s: float = Field(default=900, gt=0)

    def model_dir(self, name: str) -> Path:
        """Where `name`'s export is: a cut build in a folder of its own, never over a full one."""
        root = self.at_size_dir.resolve()
        return (root / f"layers-{self.layers}" if self.layers else root) / name

    def exports(self) -> list[str]:
        """What the suite serves: each model and its int8 export."""
        return [name for model in self.models for name in (model, INT8.get(model)) if name]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("at_size")
    group.add_argument(
        "--at-size-dir",
        default=str(DEFAULT_AT_SIZE_DIR),
        help="the at-size models (`make models-large`); built there when missing",
    )
    group.add_argument("--at-size-layers", type=int, help="cut the stand-ins to N layers")
    group.add_argument(
        "--at-size-model", action="append", choices=AT_SIZE_MODELS, help="repeatable"
    )
    group.add_argument("--runs", type=int, help="alternating runs per side (default 5)")


def config_from_args(args: argparse.Namespace) -> AtSizeBenchConfig:
    fields: dict[str, Any] = {
        "at_size_dir": Path(args.at_size_dir),
        "vllm_python": getattr(args, "vllm_python", None),
    }
    options = {"layers": args.at_size_layers, "models": args.at_size_model, "runs": args.runs}
    fields |= {name: value for name, value in options.items() if value is not None}
    return AtSizeBenchConfig.from_args(args, **fields)


def tool_parser(doc: str | None) -> argparse.ArgumentParser:
    """A stand-alone at-size tool's parser (its docstring's first paragraph for a description),
    with the options every such tool takes: where the shipped and the at-size models are."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("--models-dir", type=Path, default=Path("models"))
    parser.add_argument("--at-size-dir", type=Path, default=DEFAULT_AT_SIZE_DIR)
    return parser


def parse_tool_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """The command line parsed, and the tool's progress logged to stderr."""
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    return args
