"""Unit tests wait on events and fake clocks, never on the wall clock: no `time.sleep` or
`asyncio.sleep` but `sleep(0)` (one turn of the event loop) in tests/unit. A whole asyncio program
runs on a fake clock with tests/unit/virtual_time.py; a helper that polls a real server (a
subprocess, a socket) lives outside tests/unit with its deadline (tests/waiting.py)."""

from __future__ import annotations

import ast
from pathlib import Path

UNIT = Path(__file__).resolve().parent
SLEEPERS = {"time", "asyncio", "anyio", "trio"}


def real_sleeps(source: str) -> list[int]:
    """Lines calling a real sleep (time.sleep, asyncio.sleep, `from time import sleep`) with
    anything but a literal 0."""
    tree = ast.parse(source)
    bare = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module in SLEEPERS
        for alias in node.names
        if alias.name == "sleep"
    }
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        is_sleep = (
            isinstance(func, ast.Attribute)
            and func.attr == "sleep"
            and isinstance(func.value, ast.Name)
            and func.value.id in SLEEPERS
        ) or (isinstance(func, ast.Name) and func.id in bare)
        zero = (
            len(node.args) == 1
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value == 0
        )
        if is_sleep and not zero:
            lines.append(node.lineno)
    return lines


def test_the_checker_finds_every_form_of_a_real_sleep() -> None:
    source = (
        "import time, asyncio\nfrom time import sleep as nap\n"
        "time.sleep(0.1)\nasyncio.sleep(0)\nnap(1)\nclock.sleep(5)\nasyncio.sleep(delay)\n"
    )
    assert real_sleeps(source) == [3, 5, 7]


def test_unit_tests_sleep_only_a_turn_of_the_event_loop() -> None:
    sleeping = {
        path.name: lines
        for path in sorted(UNIT.glob("*.py"))
        if (lines := real_sleeps(path.read_text(encoding="utf-8")))
    }
    assert sleeping == {}
