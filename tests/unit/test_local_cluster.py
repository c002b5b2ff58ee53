"""LocalCluster's node start without Ray: `ray start` stood in for by shell commands that exit, or
say they started, the way `ray start --block` does."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest

from edgectl import local_cluster
from edgectl.local_cluster import STARTED_LINE, LocalCluster, NodeStartFailed, RayNode


class ScriptedCluster(LocalCluster):
    """Each node start runs the next script instead of `ray start`; the GCS lists a node ALIVE
    as soon as asked."""

    def __init__(self, root: Path, scripts: list[str]) -> None:
        super().__init__(root, 1, 2, 3, {}, root / "token")
        self.scripts = scripts
        self.starts: list[list[str]] = []

    def _start_node(
        self,
        name: str,
        num_cpus: float,
        resources: Mapping[str, float],
        extra: list[str],
        env: Mapping[str, str] | None = None,
    ) -> RayNode:
        self.starts.append(extra)
        log_path = self.root / f"{name}.log"
        offset = log_path.stat().st_size if log_path.exists() else 0
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                ["sh", "-c", self.scripts.pop(0)], stdout=log, start_new_session=True
            )
        node = RayNode(name, process, log_path, dict(resources), offset)
        self.nodes.append(node)
        return node

    def _node_registered(self, resources: Mapping[str, float]) -> bool:
        return True


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_cluster, "START_TIMEOUT_S", 1)


def test_a_node_whose_start_dies_is_started_again(tmp_path: Path, fast: None) -> None:
    cluster = ScriptedCluster(
        tmp_path, ["echo raylet died; exit 1", f"echo {STARTED_LINE}; sleep 30"]
    )
    try:
        node = cluster.add_node("ap", num_cpus=1, resources={"region:ap": 100})
        assert node.alive and cluster.nodes == [node]
        assert len(cluster.starts) == 2
    finally:
        cluster.stop()


def test_registered_is_not_up_until_ray_start_says_so(tmp_path: Path, fast: None) -> None:
    # A restart appends to the node's log: the earlier start's line does not count.
    (tmp_path / "ap.log").write_text(f"{STARTED_LINE}\n")
    cluster = ScriptedCluster(tmp_path, ["sleep 30"] * 4)
    with pytest.raises(NodeStartFailed, match="4 attempts"):
        cluster.add_node("ap", num_cpus=1, resources={"region:ap": 100})
    assert cluster.nodes == []  # nothing of the failed starts is left running


def test_every_failed_start_is_reported(tmp_path: Path, fast: None) -> None:
    cluster = ScriptedCluster(tmp_path, [f"echo attempt {n}; exit 1" for n in range(4)])
    with pytest.raises(NodeStartFailed) as failure:
        cluster.add_node("ap", num_cpus=1, resources={"region:ap": 100})
    assert all(f"attempt {n}" in str(failure.value) for n in range(4))


def test_stop_removes_the_temp_dir_the_cluster_made_and_never_one_it_was_given(
    tmp_path: Path, fast: None
) -> None:
    given = ScriptedCluster(tmp_path / "given", [f"echo {STARTED_LINE}; sleep 30"])
    given.root.mkdir()
    given.add_node("eu", num_cpus=1, resources={})
    given.stop()
    assert (given.root / "eu.log").exists()  # the caller's folder: its logs stay
    made = ScriptedCluster(tmp_path / "made", [f"echo {STARTED_LINE}; sleep 30"])
    made.root.mkdir()
    made.owns_root = True  # as LocalCluster.start sets it for its own mkdtemp
    node = made.add_node("eu", num_cpus=1, resources={})
    made.stop()
    assert not made.root.exists() and node.process.poll() is not None
