"""Progress bars on long work: the export's stages and the bench's suites, shown on a terminal
only (a bar redrawn into a log file is noise)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from benchmarks.run import suites_progress
from deployments.export.progress import RichStages, Stages, stages_for


def test_export_stages_are_reported_in_order_with_their_time() -> None:
    console = Console(file=io.StringIO(), record=True, width=120, force_terminal=True)
    stages = RichStages("glm", ["load", "export", "verify"], console=console)
    for name in ("load", "export", "verify"):
        with stages.stage(name):
            pass
    stages.close()
    text = console.export_text()
    positions = [text.index(f"glm: {name} done in") for name in ("load", "export", "verify")]
    assert positions == sorted(positions)
    assert "3/3" in text


def test_a_failed_stage_is_not_reported_done() -> None:
    console = Console(file=io.StringIO(), record=True, width=120, force_terminal=True)
    stages = RichStages("kimi", ["load", "export"], console=console)
    with pytest.raises(RuntimeError), stages.stage("load"):
        raise RuntimeError("checkpoint missing")
    stages.close()
    assert "kimi: load done" not in console.export_text()


def test_no_bar_without_a_terminal_or_when_turned_off() -> None:
    # pytest captures stderr: not a terminal, so even an enabled bar is the silent base class.
    assert type(stages_for("glm", ["load"], enabled=True)) is Stages
    assert type(stages_for("glm", ["load"], enabled=False)) is Stages
    with suites_progress(2, enabled=True) as started:
        started("models")  # a no-op without a terminal, and never raises
