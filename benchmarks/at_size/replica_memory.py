"""A second replica's memory on one node, offline (no Ray): the at-size model opened as a chat
replica opens it, by one process and then by two, each after answering one request; the node's
memory is the processes' PSS summed (/proc/<pid>/smaps_rollup: a page mapped by both counts
half to each), and what the second replica added is set against the weights' size (the export's
data files). Mapped weights are shared through the page cache; what each replica packs, caches
or allocates for itself is not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.lib import replica_process
from deployments.contracts.manifest import ModelManifest

REPO = Path(__file__).resolve().parents[2]


def replica_memory(model_dir: Path, threads: int) -> dict[str, Any]:
    """PSS of one replica alone, of two together, and the second's share of the weights."""
    weights = weights_bytes(model_dir)
    first = _start(model_dir, threads)
    try:
        alone = pss_bytes(first.pid)
        second = _start(model_dir, threads)
        try:
            together = pss_bytes(first.pid) + pss_bytes(second.pid)
        finally:
            _stop(second)
    finally:
        _stop(first)
    added = together - alone
    return {
        "weights_bytes": weights,
        "one_replica_pss_bytes": alone,
        "two_replicas_pss_bytes": together,
        "second_replica_added_bytes": added,
        "second_replica_share_of_weights": round(added / weights, 4),
    }


def weights_bytes(model_dir: Path) -> int:
    """The export's weights: its graph's files (the graph and its external data, if any)."""
    graph = model_dir / ModelManifest.load(model_dir).graph
    return sum(path.stat().st_size for path in graph.parent.glob(f"{graph.name}*"))


def pss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/{pid}/smaps_rollup has no Pss line")


def _start(model_dir: Path, threads: int) -> subprocess.Popen[str]:
    """A process that opens the model, answers one request, says READY and waits for its stdin
    to close."""
    argv = [sys.executable, "-m", replica_process.__name__, str(model_dir), str(threads)]
    process = subprocess.Popen(
        argv, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    for line in process.stdout:  # anything a library printed first is passed over
        if line.strip() == replica_process.READY:
            return process
    _stop(process)
    raise RuntimeError(f"the replica process ended (exit code {process.returncode}) unready")


def _stop(process: subprocess.Popen[str]) -> None:
    if process.stdin is not None:
        process.stdin.close()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
