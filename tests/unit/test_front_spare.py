"""The front spare (deployments.control.front_spare): a second HAProxy from Serve's config for the
node, followed, restarted and stopped as Serve's config and the process say; on fake processes
and a manual clock. Real HAProxies sharing a port: tests/integration/test_live_front_spare.py."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from pathlib import Path

import pytest

from deployments.config.front_spare import FrontSpareConfig
from deployments.control.front_spare import SpareFront
from deployments.ray_ext.haproxy_front import spare_config

SERVE_CONFIG = """global
    stats socket {folder}/admin.sock mode 666 level admin expose-fd listeners
    maxconn 4096
    server-state-base {folder}
    server-state-file {folder}/server-state
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
    load-server-state-from-file global
frontend prometheus
    bind :{metrics}
    mode http
    http-request use-service prometheus-exporter if {{ path /metrics }}
frontend http_frontend
    bind 127.0.0.1:{port}
    http-request return status 200 content-type text/plain string "spare" if {{ path /-/healthz }}
    default_backend routers
backend routers
    server router-1 127.0.0.1:9 check
listen stats
  bind *:{stats}
  stats enable
"""


def serve_config(
    port: int = 18000, folder: str = "/tmp/x", metrics: int = 18001, stats: int = 18002
) -> str:
    return SERVE_CONFIG.format(port=port, metrics=metrics, stats=stats, folder=folder)


class FakeProcess:
    next_pid = 100

    def __init__(self, args: Sequence[str]) -> None:
        FakeProcess.next_pid += 1
        self.pid = FakeProcess.next_pid
        self.args = list(args)
        self.code: int | None = None
        self.signals: list[int] = []

    def poll(self) -> int | None:
        return self.code

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        if sig == signal.SIGTERM:
            self.code = -sig

    def wait(self, timeout: float | None = None) -> int:
        if self.code is None:
            raise __import__("subprocess").TimeoutExpired(self.args, timeout or 0)
        return self.code


class Fixture:
    def __init__(self, tmp_path: Path) -> None:
        self.now = 0.0
        self.source = tmp_path / "serve" / "haproxy.cfg"
        self.source.parent.mkdir()
        self.started: list[FakeProcess] = []
        self.front = SpareFront(
            self.source,
            tmp_path / "spare",
            "/bin/haproxy",
            FrontSpareConfig(failed_start_backoff_s=30.0),
            launch=self.launch,
            clock=lambda: self.now,
        )

    def launch(self, args: Sequence[str], stderr_path: Path) -> FakeProcess:
        process = FakeProcess(args)
        self.started.append(process)
        return process


@pytest.fixture
def spare(tmp_path: Path) -> Fixture:
    return Fixture(tmp_path)


def test_the_spares_config_is_serves_without_what_belongs_to_its_one_process():
    copy = spare_config(serve_config())
    for gone in ("stats socket", "server-state", "frontend prometheus", "listen stats", ":18002"):
        assert gone not in copy
    for kept in ("maxconn 4096", "bind 127.0.0.1:18000", "backend routers", "server router-1"):
        assert kept in copy


def test_nothing_is_started_on_a_node_without_serves_haproxy(spare: Fixture):
    spare.front.check()
    assert spare.started == [] and not spare.front.running


def test_it_starts_from_serves_config_and_leaves_a_running_spare_alone(spare: Fixture):
    spare.source.write_text(serve_config())
    spare.front.check()
    spare.front.check()
    (process,) = spare.started
    assert process.args == ["/bin/haproxy", "-db", "-f", str(spare.front.workdir / "haproxy.cfg")]
    assert (spare.front.workdir / "haproxy.cfg").read_text() == spare_config(serve_config())
    assert spare.front.describe()["running"] and spare.front.describe()["pid"] == process.pid


def test_a_changed_config_is_a_graceful_reload_of_the_running_spare(spare: Fixture):
    spare.source.write_text(serve_config())
    spare.front.check()
    spare.source.write_text(serve_config().replace("router-1", "router-2"))
    spare.front.check()
    first, second = spare.started
    assert second.args[-2:] == ["-sf", str(first.pid)]  # the new one tells the old to stop
    assert "router-2" in (spare.front.workdir / "haproxy.cfg").read_text()


def test_a_config_without_routes_yet_is_not_followed_while_the_spare_runs(spare: Fixture):
    spare.source.write_text(serve_config())
    spare.front.check()
    # Serve's HAProxy restarted: its first config routes nothing (a 404 to every request).
    not_ready = serve_config().replace("router-1", "none") + "# Route table is not populated yet.\n"
    spare.source.write_text(not_ready)
    spare.front.check()
    assert len(spare.started) == 1
    spare.source.write_text(serve_config().replace("router-1", "router-2"))  # its routes came
    spare.front.check()
    assert len(spare.started) == 2


def test_a_killed_spare_is_started_again_at_the_next_check(spare: Fixture):
    spare.source.write_text(serve_config())
    spare.front.check()
    spare.started[0].code = -signal.SIGKILL
    spare.front.check()
    assert len(spare.started) == 2 and "-sf" not in spare.started[1].args
    assert spare.front.failed_starts == 0


def test_a_failed_start_waits_for_a_new_config_or_the_backoff(spare: Fixture):
    spare.source.write_text(serve_config())
    spare.front.check()
    (spare.front.workdir / "haproxy.stderr.log").write_text("[ALERT] cannot bind socket")
    spare.started[0].code = 1
    spare.front.check()
    spare.now = 29.0
    spare.front.check()
    assert len(spare.started) == 1
    assert spare.front.failed_starts == 1 and "cannot bind" in (spare.front.last_error or "")
    spare.now = 31.0
    spare.front.check()
    assert len(spare.started) == 2
    spare.started[1].code = 1
    spare.front.check()
    spare.source.write_text(serve_config().replace("router-1", "router-2"))
    spare.front.check()  # Serve's new config: tried at once
    assert len(spare.started) == 3


def test_serves_haproxy_gone_from_the_node_stops_the_spare_softly(spare: Fixture):
    spare.source.write_text(serve_config())
    spare.front.check()
    spare.source.unlink()
    spare.front.check()
    assert spare.started[0].signals == [signal.SIGUSR1] and not spare.front.running


def test_stop_ends_softly_then_at_the_grace(spare: Fixture):
    spare.source.write_text(serve_config())
    spare.front.check()
    spare.front.stop(grace_s=0.0)
    assert spare.started[0].signals == [signal.SIGUSR1, signal.SIGTERM]


def test_a_failed_replacement_says_the_spare_before_it_still_listens(spare: Fixture):
    spare.source.write_text(serve_config())
    spare.front.check()
    spare.source.write_text(serve_config().replace("router-1", "router-2"))
    spare.front.check()
    spare.started[1].code = 1  # the reload's HAProxy refused its config: the first one stays
    spare.front.check()
    described = spare.front.describe()
    assert not described["running"] and described["older_alive"] == 1
    assert described["failed_starts"] == 1
