"""The one ONNX Runtime session factory: provider choice, graph optimisation, threads, IO binding
on CUDA, warm-up and load-time measurement for every model runtime."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import onnxruntime as ort

# Provider re-exported: benchmarks name it from here.
from deployments.contracts.session_config import Provider as Provider
from deployments.contracts.session_config import SessionConfig

_OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def cuda_available() -> bool:
    return "CUDAExecutionProvider" in ort.get_available_providers()


def uses_cuda(config: SessionConfig) -> bool:
    """Whether a session opened with `config` runs on CUDA (`auto` takes it where it is)."""
    return config.provider == "cuda" or (config.provider == "auto" and cuda_available())


def _providers(config: SessionConfig) -> list[str | tuple[str, dict[str, object]]]:
    want_cuda = uses_cuda(config)
    if config.provider == "cuda" and not cuda_available():
        raise RuntimeError(
            "provider 'cuda' requested but this onnxruntime has no CUDAExecutionProvider "
            "(install the `gpu` extra: make install ACCEL=gpu)"
        )
    if want_cuda:
        return [("CUDAExecutionProvider", {"device_id": config.device_id}), "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


@dataclass
class TransferCounter:
    """Bytes moved between host arrays and the session's device memory (on the CPU provider:
    the bytes that would cross on a GPU), so the two decode paths compare on any machine."""

    host_to_device: int = 0
    device_to_host: int = 0
    runs: int = 0


@dataclass
class OnnxSession:
    """An opened graph plus what the cold-start accounting needs to know about opening it."""

    session: ort.InferenceSession
    provider: Literal["cuda", "cpu"]
    load_s: float
    io_binding: bool
    device_id: int = 0
    warmup_s: float = 0.0
    input_names: tuple[str, ...] = field(default=())
    output_names: tuple[str, ...] = field(default=())
    transfers: TransferCounter = field(default_factory=lambda: TransferCounter())

    @property
    def device_type(self) -> Literal["cuda", "cpu"]:
        return self.provider

    def run_on_device(
        self,
        host_inputs: Mapping[str, np.ndarray],
        device_inputs: Mapping[str, ort.OrtValue],
        host_outputs: Sequence[str],
    ) -> tuple[dict[str, np.ndarray], dict[str, ort.OrtValue]]:
        """Run with IO binding: `device_inputs` are used where they are (no copy), every output
        but `host_outputs` stays in device memory as an OrtValue for the next run to take, and
        only `host_inputs` / `host_outputs` cross between host and device (counted)."""
        binding = self.session.io_binding()
        for name, value in host_inputs.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(value))
            self.transfers.host_to_device += value.nbytes
        for name, ort_value in device_inputs.items():
            binding.bind_ortvalue_input(name, ort_value)
        for name in self.output_names:
            on_host = name in host_outputs
            binding.bind_output(name, "cpu" if on_host else self.device_type, self.device_id)
        self.session.run_with_iobinding(binding)
        outputs = dict(zip(self.output_names, binding.get_outputs(), strict=True))
        host = {name: outputs.pop(name).numpy() for name in host_outputs}
        self.transfers.device_to_host += sum(value.nbytes for value in host.values())
        self.transfers.runs += 1
        return host, outputs

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every input from host memory, every output back to it (counted as crossing)."""
        if self.provider == "cuda" and self.io_binding:
            outputs = self._run_bound(feeds)
        else:
            values = self.session.run(list(self.output_names), dict(feeds))
            outputs = dict(zip(self.output_names, values, strict=True))
        self.transfers.host_to_device += sum(value.nbytes for value in feeds.values())
        self.transfers.device_to_host += sum(value.nbytes for value in outputs.values())
        self.transfers.runs += 1
        return outputs

    def _run_bound(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        # Outputs stay on the GPU until the run ends, so ORT allocates them once, in device memory.
        binding = self.session.io_binding()
        for name, value in feeds.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(value))
        for name in self.output_names:
            binding.bind_output(name, "cuda", self.device_id)
        self.session.run_with_iobinding(binding)
        return dict(zip(self.output_names, binding.copy_outputs_to_cpu(), strict=True))

    def warm_up(self, feeds: Mapping[str, np.ndarray]) -> float:
        """Run once so the first real request does not pay for lazy allocations; returns seconds."""
        start = time.perf_counter()
        self.run(feeds)
        self.warmup_s = time.perf_counter() - start
        return self.warmup_s

    def input_type(self, name: str) -> str:
        return next(i.type for i in self.session.get_inputs() if i.name == name)


def open_session(
    graph: str | Path | bytes,
    config: SessionConfig | None = None,
    *,
    external_data_dir: Path | None = None,
) -> OnnxSession:
    """`graph`: a file, or a serialised graph whose external weights (if any) lie in
    `external_data_dir` (a file's own folder otherwise)."""
    config = config or SessionConfig()
    options = ort.SessionOptions()
    if external_data_dir is not None:
        options.add_session_config_entry(
            "session.model_external_initializers_file_folder_path", str(external_data_dir)
        )
    options.graph_optimization_level = _OPT_LEVELS[config.graph_optimization]
    options.intra_op_num_threads = config.intra_op_threads
    options.inter_op_num_threads = config.inter_op_threads
    options.log_severity_level = 3  # errors only: ORT's warnings about fallbacks are ours to report
    if config.profile_file_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = config.profile_file_prefix

    start = time.perf_counter()
    source = graph if isinstance(graph, bytes) else str(graph)
    session = ort.InferenceSession(source, options, providers=_providers(config))
    load_s = time.perf_counter() - start

    provider: Literal["cuda", "cpu"] = (
        "cuda" if session.get_providers()[0] == "CUDAExecutionProvider" else "cpu"
    )
    return OnnxSession(
        session=session,
        provider=provider,
        load_s=load_s,
        io_binding=provider == "cuda" if config.io_binding is None else config.io_binding,
        device_id=config.device_id,
        input_names=tuple(i.name for i in session.get_inputs()),
        output_names=tuple(o.name for o in session.get_outputs()),
    )
