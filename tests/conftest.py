"""Shared fixtures: where the embedded default models live (built on demand); a real headless
Chromium (Debian's) driven by Playwright, and where tests write their artefacts; Redis and
PostgreSQL servers of the test's own (Debian's binaries, edgectl.local_services); what a test does
where the machine lacks one (`unavailable`); under CI=true no skip passes unseen (ci_skips)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import pytest

# Every test's skip policy under CI=true: hooks, found here by name.
from ci_skips import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401

# The system's Chromium (`apt-get install chromium`): Playwright never downloads a browser here.
from deployments.ingress.dashboard.screenshot import CHROMIUM, CHROMIUM_ARGS
from edgectl.local_services import PostgresServer, RedisServer, ServiceUnavailable, redis_binary

REPO = Path(__file__).resolve().parent.parent
ARTEFACTS = Path(os.environ.get("EDGE_TEST_ARTEFACTS", REPO / "test-artefacts"))


def _no_browser_reason() -> str | None:
    if not CHROMIUM.is_file():
        return f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright for Python is not installed (the dev extra)"
    return None


def missing(reason: str) -> NoReturn:
    """The one outcome of a test whose machine lacks what it needs (a server's binary, root, the
    browser): a skip whose reason names what is missing and how to get it (`make system-deps`, a
    step of `make test`, installs the Debian packages). Under CI=true it fails (ci_skips)."""
    pytest.skip(reason)


@pytest.fixture(scope="session")
def unavailable() -> Callable[[str], NoReturn]:
    """`missing` for a test or fixture: unavailable("no X here (how to get it)")."""
    return missing


ServerT = TypeVar("ServerT", RedisServer, PostgresServer)


def _own_server(start: Callable[[], ServerT]) -> Iterator[ServerT]:
    """A server of the fixture's own, removed after; `missing` without its binaries."""
    try:
        server = start()
    except ServiceUnavailable as absent:
        missing(str(absent))
    try:
        yield server
    finally:
        server.remove()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A redis-server of this test's own: its temp dir, a free port, a password; removed after."""
    yield from _own_server(RedisServer.start)


@pytest.fixture(scope="session")
def redis_server_binary() -> Path:
    """Debian's redis-server, for code that starts its own (a benchmark suite)."""
    try:
        return redis_binary()
    except ServiceUnavailable as absent:
        missing(str(absent))


@pytest.fixture
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL cluster of this test's own (initdb in a temp dir, a free port, database and
    role `edge`); stopped and removed after."""
    yield from _own_server(PostgresServer.start)


@pytest.fixture(scope="session")
def shared_postgres() -> Iterator[PostgresServer]:
    """One PostgreSQL cluster for the session's tests that only need a database of their own
    (postgres_database); a test that kills or restarts its server takes postgres_server."""
    yield from _own_server(PostgresServer.start)


@pytest.fixture
def postgres_database(shared_postgres: PostgresServer) -> str:
    """A new, empty database on the session's PostgreSQL: its DSN."""
    return shared_postgres.create_database(f"test_{secrets.token_hex(6)}")


@pytest.fixture
def chromium() -> Iterator[Any]:
    """A headless Chromium; `missing` where there is none. Per test: Playwright's
    sync API holds an event loop on this thread while open, which asyncio.run() elsewhere
    would trip over."""
    reason = _no_browser_reason()
    if reason is not None:
        missing(f"browser tests: {reason}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=list(CHROMIUM_ARGS), headless=True
        )
        yield browser
        browser.close()


@pytest.fixture
def artefacts(request: pytest.FixtureRequest) -> Path:
    """A folder for this test's artefacts (screenshots), kept after the run."""
    folder = ARTEFACTS / request.node.name.replace("/", "_").replace("[", "_").rstrip("]")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def models_root() -> Path:
    """The default models built by `make models` (or EDGE_MODELS_DIR); built here if missing or
    built by an older exporter."""
    root = Path(os.environ.get("EDGE_MODELS_DIR", REPO / "models"))
    from deployments.export.defaults import DEFAULT_MODELS, build_defaults, is_built

    missing = [name for name in DEFAULT_MODELS if not is_built(root, name)]
    if missing:
        build_defaults(root, only=missing)
    return root
