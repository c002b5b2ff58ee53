"""The gateway's request log as a planner trace (`edge plan --trace request-log:...`): a real
log written by the routers' own RequestLog, on both backends, read back through the source; and
edge plan end to end on a small SQLite log. No Ray."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from ledger_records import NOW, record

from deployments.ingress.state.database import Database
from deployments.ingress.state.migrations import migrate
from deployments.ingress.state.postgres import PostgresDatabase
from deployments.ingress.state.request_log import LogFilter, RequestLog, RequestRecord
from deployments.ingress.state.sqlite import SqliteDatabase
from edge_sim.config import EdgeConfig
from edgectl.plan.cli import main as plan_main
from edgectl.plan.config import load_serve_config
from edgectl.plan.sources import replay_source
from edgectl.plan.sources.request_log import read_request_log
from edgectl.plan.sources.scope import SourceScope, shown

CONFIG = Path(__file__).parents[2] / "serve_config.yaml"
SERVED = ("glm", "embedding")


def logged(t_s: float, **changes: object) -> RequestRecord:
    """A request that arrived at NOW + t_s and took 200 ms (the log keeps when it ended)."""
    return record(ts=NOW + t_s + 0.2, latency_ms=200.0, request_id=None, **changes)


# Written out of time order (a later batch can hold an earlier request); 5 of 12 are load.
LOG = [
    logged(5.0, colo="SIN", region="ap", model="embedding", input_tokens=3),
    logged(0.0),
    logged(2.0, colo="IAD", region="us", status=499),  # the client left: the model worked
    logged(1.0, colo="AMS", model="kimi"),  # not served by this config
    logged(3.0, colo=None, region=None, status=401, error_type="AuthenticationError"),
    logged(3.5, colo=None, region=None, status=429, error_type="RateLimitedError"),
    logged(4.0, colo=None, region=None, status=503, error_type="QueueFullError"),
    logged(4.5, cache="HIT"),
    logged(4.6, cache="JOINED"),  # waited for an identical request's answer: no model call
    logged(6.0, colo="XXX"),  # a colo this world does not have
    logged(7.0, model=None, colo=None, region=None, status=400),
    logged(8.0, colo="FRA", status=500, error_type="InternalServerError"),  # failed mid-stream
]


def write_log(database: Database, records: Sequence[RequestRecord]) -> None:
    async def main() -> None:
        try:
            await migrate(database, NOW)
            await RequestLog(database).write(records)
        finally:
            await database.close()

    asyncio.run(main())


@pytest.fixture(params=["sqlite", "postgres"])
def log_location(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Callable]]:
    """LOCATION of an empty gateway database on the backend, and how to open it to write."""
    if request.param == "sqlite":
        path = tmp_path / "gateway.sqlite3"
        yield str(path), lambda: SqliteDatabase(path)
    else:
        dsn = request.getfixturevalue("postgres_database")
        yield dsn, lambda: PostgresDatabase(dsn)


def scope(**window: float) -> SourceScope:
    return SourceScope(load_serve_config(CONFIG).edge, SERVED, **window)


def test_request_log_replays_routed_requests_of_served_models_at_their_entry_colos(
    log_location: tuple[str, Callable[[], Database]],
):
    location, open_db = log_location
    write_log(open_db(), LOG)
    replay, rows = read_request_log(location, scope())
    (chunk,) = list(replay.trace.chunks())
    # Arrival = end - latency; t = 0 at the first replayed arrival, in time order.
    assert chunk.t_s.tolist() == pytest.approx([0.0, 2.0, 5.0, 8.0])
    assert replay.started_at_s == pytest.approx(NOW)
    origins = [replay.trace.origins[i].name for i in chunk.origin]
    models = [replay.trace.models[m] for m in chunk.model]
    assert origins == ["FRA", "IAD", "SIN", "FRA"]
    assert models == ["glm", "glm", "embedding", "glm"]
    fra = next(o for o in replay.trace.origins if o.name == "FRA")
    colo = next(c for c in scope().edge.resolved_topology.colos if c.id == "FRA")
    assert (fra.lat, fra.lon) == (colo.lat, colo.lon)  # clients sent from their entry colo
    assert replay.skipped == {
        "client error (4xx)": 3,
        "cache hit": 1,
        "joined an identical request": 1,
        "model not served: kimi": 1,
        "no entry colo (5xx: shed or failed)": 1,
        "colo not in the topology: XXX": 1,
    }
    assert replay.requests == 4 and sum(replay.skipped.values()) + 4 == len(LOG)
    # What the log saw is kept beside the trace.
    assert [(r.region, r.status, r.input_tokens) for r in rows] == [
        ("eu", 200, 12), ("us", 499, 12), ("ap", 200, 3), ("eu", 500, 12)
    ]  # fmt: skip
    # A wall-clock window: rows that ended in [since, until).
    windowed, _ = read_request_log(location, scope(since_s=NOW + 1.5, until_s=NOW + 6))
    assert windowed.requests == 2 and "cache hit" in windowed.skipped


def test_request_log_source_refuses_what_it_cannot_replay(
    log_location: tuple[str, Callable[[], Database]],
):
    location, open_db = log_location

    async def other_tables(database: Database) -> None:
        await database.execute("CREATE TABLE other (id INTEGER)")
        await database.close()

    asyncio.run(other_tables(open_db()))
    with pytest.raises(ValueError, match="no request_log table"):
        read_request_log(location, scope())  # no router has migrated it yet
    write_log(open_db(), [])
    with pytest.raises(ValueError, match="no requests logged$"):
        read_request_log(location, scope())
    write_log(open_db(), [logged(0.0, status=404), logged(1.0, model="kimi")])
    with pytest.raises(ValueError, match=r"none of its 2 rows is replayable \(1 client error"):
        read_request_log(location, scope())
    with pytest.raises(ValueError, match="no requests logged in the --since/--until window"):
        read_request_log(location, scope(since_s=NOW + 3600))


def test_request_log_locations_that_are_not_a_gateway_database(tmp_path: Path):
    with pytest.raises(ValueError, match="missing.sqlite3: no such file"):
        read_request_log(str(tmp_path / "missing.sqlite3"), scope())
    assert not (tmp_path / "missing.sqlite3").exists()  # not created by looking
    text = tmp_path / "requests.csv"
    text.write_text("seq,model\n")
    with pytest.raises(ValueError, match="not a SQLite database"):
        read_request_log(str(text), scope())
    with pytest.raises(ValueError, match=r"a SQLite file or a postgresql:// URL"):
        read_request_log("mysql://root:hunter2@db/edge", scope())
    # Nothing listens on port 1: a clear error naming the database, never its password.
    with pytest.raises(ValueError, match=r"request-log:postgresql://127.0.0.1:1/edge: ") as error:
        read_request_log("postgresql://edge:hunter2@127.0.0.1:1/edge", scope())
    assert "hunter2" not in str(error.value)
    assert shown("postgresql://edge:pw@db.internal:5433/gw") == "postgresql://db.internal:5433/gw"
    assert shown("request-log:postgres://e:p@ss@db/gw?password=x") == (
        "request-log:postgres://db/gw?password=..."
    )
    assert replay_source("gateway:db", scope()) is None


def test_a_postgresql_that_refuses_the_login_is_a_clear_error(
    shared_postgres, tmp_path: Path, capsys
):
    wrong = shared_postgres.dsn.replace(shared_postgres.password, "not-the-password")
    with pytest.raises(ValueError, match="password authentication failed") as error:
        read_request_log(wrong, scope())
    assert "not-the-password" not in str(error.value)
    assert plan_main(["--trace", f"request-log:{wrong}", "--out", str(tmp_path)]) == 2
    assert "not-the-password" not in capsys.readouterr().err


def test_request_log_scan_reads_every_row_in_batches(tmp_path: Path):
    path = tmp_path / "gateway.sqlite3"
    write_log(SqliteDatabase(path), [logged(float(i)) for i in range(25)])

    async def scan() -> list[tuple]:
        database = SqliteDatabase(path)
        try:
            log = RequestLog(database)
            return [r async for r in log.scan(LogFilter(), ["ts", "colo"], batch_rows=10)]
        finally:
            await database.close()

    rows = asyncio.run(scan())
    assert [r[0] for r in rows] == pytest.approx([NOW + i + 0.2 for i in range(25)])
    with pytest.raises(ValueError, match="no columns"):
        asyncio.run(_first(RequestLog(SqliteDatabase(path)), ["ts; DROP TABLE request_log"]))


async def _first(log: RequestLog, columns: list[str]) -> object:
    return await anext(log.scan(LogFilter(), columns))


def test_edge_plan_replays_a_request_log_and_says_what_it_left_out(tmp_path: Path, capsys):
    path = tmp_path / "gateway.sqlite3"
    write_log(SqliteDatabase(path), [*LOG, logged(9.0, model="llama")])  # kimi is served here
    out = tmp_path / "plan"
    code = plan_main(
        ["--config", str(CONFIG), "--trace", f"request-log:{path}", "--policy", "config",
         "--policy", "min:1", "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "Replayed 5 requests, t = 0 at 2025-12-02T00:00:00Z" in printed
    assert "1 model not served: llama" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["totals"]["arrivals"] == 5 and summary["totals"]["sheds"] == 0
    assert summary["params"]["replay"]["skipped"]["client error (4xx)"] == 3
    by_model: dict[str, int] = {}
    for pool in summary["pools"]:
        by_model[pool["model"]] = by_model.get(pool["model"], 0) + pool["requests"]
    assert by_model == {"embedding": 1, "glm": 3, "kimi": 1}  # the router's own routing places them
    report = (out / "report.md").read_text()
    assert "Replayed 5 requests" in report and "3 client error (4xx)" in report


def test_edge_plan_request_log_errors_exit_2_without_a_traceback(tmp_path: Path, capsys):
    out = str(tmp_path / "plan")
    empty = tmp_path / "empty.sqlite3"
    write_log(SqliteDatabase(empty), [])
    assert plan_main(["--trace", f"request-log:{empty}", "--out", out]) == 2
    assert "empty.sqlite3: no requests logged" in capsys.readouterr().err
    missing = tmp_path / "none.sqlite3"
    assert plan_main(["--trace", f"request-log:{missing}", "--out", out]) == 2
    assert "none.sqlite3: no such file" in capsys.readouterr().err
    assert plan_main(["--trace", "flat", "--since", "2025-12-01", "--out", out]) == 2
    assert "--since/--until: only with" in capsys.readouterr().err
    records = tmp_path / "requests.csv"
    records.write_text("scheduled_s,model,region,ok,latency_ms\n")
    assert plan_main(["--trace", f"records:{records}", "--until", "1", "--out", out]) == 2
    assert "a load test's records have no wall-clock times" in capsys.readouterr().err
    with pytest.raises(SystemExit) as bad_time:
        plan_main(["--trace", f"request-log:{empty}", "--since", "yesterday"])
    assert bad_time.value.code == 2 and "not a time: 'yesterday'" in capsys.readouterr().err


def test_an_edge_config_of_other_colos_skips_the_rows_of_colos_it_lacks(tmp_path: Path):
    path = tmp_path / "gateway.sqlite3"
    write_log(SqliteDatabase(path), LOG)
    edge = EdgeConfig.model_validate(
        {"topology": {"colos": [{"id": "FRA", "city": "Frankfurt", "country": "DE",
                                 "lat": 50.11, "lon": 8.68}]}}
    )  # fmt: skip
    replay, _ = read_request_log(str(path), SourceScope(edge, SERVED))
    assert replay.requests == 2
    assert replay.skipped["colo not in the topology: IAD"] == 1
