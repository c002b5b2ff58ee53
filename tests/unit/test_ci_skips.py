"""The skip policy of every test session (tests/ci_skips.py), on a pytest run of its own: off CI
a skip is a skip; under CI=true a skip in a test, a fixture or at import fails the session with
its reason, unless the allow-list names it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
CONFTEST = """
import ci_skips
from ci_skips import AllowedSkip, pytest_make_collect_report, pytest_runtest_makereport

ci_skips.ALLOWED_SKIPS = (AllowedSkip(reason="needs a GPU", why="CI's machine has none"),)
"""
SKIPPING = """
import pytest

@pytest.fixture
def server():
    pytest.skip("no redis-server on this machine (apt-get install redis-server)")

def test_in_a_fixture(server):
    pass

def test_in_the_body():
    pytest.skip("no root")

@pytest.mark.skipif(True, reason="marked")
def test_marked():
    pass

def test_allowed():
    pytest.skip("this needs a GPU, sorry")

def test_runs():
    pass
"""
AT_IMPORT = """
import pytest

pytest.importorskip("no_such_module_anywhere")
"""


def pytest_run(tmp_path: Path, ci: str | None, module: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_module.py").write_text(module)
    env = {key: value for key, value in os.environ.items() if key != "CI"}
    env["PYTHONPATH"] = str(TESTS)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_off_ci_a_skip_stays_a_skip(tmp_path: Path) -> None:
    run = pytest_run(tmp_path, None, SKIPPING)
    assert run.returncode == 0, run.stdout
    assert "1 passed, 4 skipped" in run.stdout, run.stdout
    assert pytest_run(tmp_path, None, AT_IMPORT).returncode == 5  # all skipped: none ran


def test_under_ci_every_skip_off_the_allow_list_fails_the_session(tmp_path: Path) -> None:
    run = pytest_run(tmp_path, "true", SKIPPING)
    assert run.returncode == 1, run.stdout
    lines = run.stdout.splitlines()
    refused = "skipped under CI=true, which runs every test"
    # At setup (a fixture, a mark) pytest calls it an error; in the test's body, a failure.
    for where in ("test_in_a_fixture", "test_marked"):
        assert any(line.startswith("ERROR") and where in line for line in lines), run.stdout
    assert any(line.startswith("FAILED") and "test_in_the_body" in line for line in lines)
    assert f"{refused} (allow-list: tests/ci_skips.py): no redis-server" in run.stdout
    assert any(line.startswith("SKIPPED") and "needs a GPU" in line for line in lines)
    assert any(line.startswith("PASSED") and "test_runs" in line for line in lines)


def test_under_ci_a_module_skipped_at_import_is_a_collection_error(tmp_path: Path) -> None:
    run = pytest_run(tmp_path, "1", AT_IMPORT)
    assert run.returncode == 2, run.stdout  # interrupted: errors during collection
    assert "ERROR test_module.py - skipped under CI=true" in run.stdout, run.stdout
