"""A booting node's session weight: raised and restored on a real process session, without Ray."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from typing import NoReturn

import pytest

from edgectl.boot_priority import BOOT_NICE, session_nice, set_session_nice


@pytest.fixture
def session() -> Iterator[subprocess.Popen[bytes]]:
    """A process leading a session of its own, as `ray start` for a node does."""
    process = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        yield process
    finally:
        process.kill()
        process.wait()


@pytest.fixture
def root(unavailable: Callable[[str], NoReturn]) -> None:
    if os.geteuid() != 0:
        unavailable("a negative nice needs CAP_SYS_NICE: run as root (CI does)")


@pytest.mark.usefixtures("root")
def test_a_booting_session_is_weighted_up_then_back(session: subprocess.Popen[bytes]) -> None:
    assert session_nice(session.pid) == 0
    assert set_session_nice(session.pid, BOOT_NICE)
    assert session_nice(session.pid) == BOOT_NICE
    assert set_session_nice(session.pid, 0)
    assert session_nice(session.pid) == 0


def test_a_session_that_is_gone_is_reported_not_raised(session: subprocess.Popen[bytes]) -> None:
    session.kill()
    session.wait()
    assert set_session_nice(session.pid, BOOT_NICE) is False
