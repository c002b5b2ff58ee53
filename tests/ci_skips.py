"""Under CI=true a skip cannot pass unseen: a test (or a module) that skips fails instead, unless
its reason is on ALLOWED_SKIPS, which says why CI may go without it. Off CI a skip stays a skip
with its reason (`-ra`). Hooks re-exported by tests/conftest.py, so they hold for every test."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

import pytest

CI_ENV = "CI"


@dataclass(frozen=True)
class AllowedSkip:
    """A skip CI may pass with: its reason matches `reason` (a regular expression, searched)."""

    reason: str
    why: str


# Empty today, and short by intent: CI runs as root after `make system-deps`, `make checkov` and
# `make models`, so it has everything every test needs. An entry names a skip and why CI may pass
# without that test (e.g. hardware CI's machine cannot have).
ALLOWED_SKIPS: tuple[AllowedSkip, ...] = ()


def in_ci(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get(CI_ENV, "").strip().lower() in ("true", "1")


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    """What pytest.skip() was given, as `-ra` shows it."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def allowed(reason: str) -> bool:
    return any(re.search(entry.reason, reason) for entry in ALLOWED_SKIPS)


def refuse_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    """A skip off the allow-list becomes a failure that says what was skipped and why."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = skip_reason(report)
    if allowed(reason):
        return
    report.outcome = "failed"
    report.longrepr = (
        f"skipped under {CI_ENV}=true, which runs every test (allow-list: tests/ci_skips.py): "
        f"{reason}"
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    report: pytest.TestReport = yield
    if in_ci():
        refuse_skip(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> pytest.CollectReport:
    report: pytest.CollectReport = yield
    if in_ci():
        refuse_skip(report)
    return report
