"""The schema, as numbered migrations applied once each, in order, and recorded in
`schema_migrations`. Routers starting together apply them once: the whole run holds the
database's write lock (SQLite) or an advisory lock (PostgreSQL). A migration is never edited
once shipped; a change is a new one. A table per concern, so a new concern (the batch API's
jobs) is a new migration and a new access module."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from deployments.ingress.state.database import Database, Dialect

# Any constant both sides agree on: the key of PostgreSQL's advisory lock for migrations.
MIGRATION_LOCK_KEY = 0x65646765  # "edge"
# What differs between the dialects in our DDL: an auto-numbered primary key.
IDENTITY: Mapping[Dialect, str] = {
    "sqlite": "INTEGER PRIMARY KEY AUTOINCREMENT",
    "postgres": "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
}


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]  # `{identity}` stands for the dialect's auto-numbered key

    def sql(self, dialect: Dialect) -> list[str]:
        return [s.format(identity=IDENTITY[dialect]) for s in self.statements]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "request log: one row per model request (the usage ledger)",
        (
            """CREATE TABLE request_log (
                id {identity},
                ts DOUBLE PRECISION NOT NULL,
                day TEXT NOT NULL,
                request_id TEXT,
                key_id TEXT,
                endpoint TEXT NOT NULL,
                model TEXT,
                region TEXT,
                colo TEXT,
                route_reason TEXT,
                status INTEGER NOT NULL,
                stream INTEGER NOT NULL,
                input_tokens INTEGER NOT NULL,
                output_tokens INTEGER NOT NULL,
                cost_units DOUBLE PRECISION NOT NULL,
                latency_ms DOUBLE PRECISION NOT NULL,
                ttft_ms DOUBLE PRECISION,
                cold_start_ms DOUBLE PRECISION,
                cache TEXT,
                error_type TEXT,
                payload TEXT
            )""",
            "CREATE INDEX request_log_ts ON request_log (ts)",
            "CREATE INDEX request_log_key_ts ON request_log (key_id, ts)",
            "CREATE INDEX request_log_day ON request_log (day)",
        ),
    ),
    Migration(
        2,
        "virtual keys, and a version every router polls to follow them",
        (
            """CREATE TABLE api_keys (
                id TEXT PRIMARY KEY,
                name TEXT NOT NULL,
                digest TEXT NOT NULL UNIQUE,
                models TEXT,
                requests_per_minute INTEGER,
                tokens_per_minute INTEGER,
                budget_cost_units DOUBLE PRECISION,
                budget_period TEXT,
                fallback_model TEXT,
                collect_payloads INTEGER NOT NULL,
                expires_at DOUBLE PRECISION,
                created_at DOUBLE PRECISION NOT NULL,
                revoked_at DOUBLE PRECISION
            )""",
            "CREATE TABLE state_versions (name TEXT PRIMARY KEY, version BIGINT NOT NULL)",
            "INSERT INTO state_versions (name, version) VALUES ('api_keys', 0)",
        ),
    ),
    Migration(
        3,
        "spend per key and budget period: settled cost and what requests in flight reserved",
        (
            """CREATE TABLE key_spend (
                key_id TEXT NOT NULL,
                period TEXT NOT NULL,
                spent DOUBLE PRECISION NOT NULL,
                reserved DOUBLE PRECISION NOT NULL,
                PRIMARY KEY (key_id, period)
            )""",
        ),
    ),
    Migration(
        4,
        "batch jobs (Workers AI's queueRequest): the job with its claim lease, and one row per "
        "item whose response is written as it completes",
        (
            """CREATE TABLE batch_jobs (
                id TEXT PRIMARY KEY,
                key_id TEXT NOT NULL,
                model TEXT NOT NULL,
                served_model TEXT NOT NULL,
                status TEXT NOT NULL,
                item_count INTEGER NOT NULL,
                created_at DOUBLE PRECISION NOT NULL,
                updated_at DOUBLE PRECISION NOT NULL,
                expires_at DOUBLE PRECISION,
                lease_owner TEXT,
                lease_until DOUBLE PRECISION
            )""",
            "CREATE INDEX batch_jobs_status ON batch_jobs (status, created_at)",
            """CREATE TABLE batch_items (
                job_id TEXT NOT NULL,
                idx INTEGER NOT NULL,
                input TEXT NOT NULL,
                external_reference TEXT,
                response TEXT,
                prompt_tokens INTEGER,
                completion_tokens INTEGER,
                PRIMARY KEY (job_id, idx)
            )""",
        ),
    ),
    Migration(
        5,
        "a virtual key's weight in a full model's fair queue (null: security.default_limits')",
        ("ALTER TABLE api_keys ADD COLUMN weight DOUBLE PRECISION",),
    ),
)


async def migrate(
    database: Database, now_s: float, migrations: Sequence[Migration] = MIGRATIONS
) -> list[int]:
    """Apply the migrations this database lacks; the versions applied now (empty: up to date)."""
    applied: list[int] = []
    async with database.transaction() as tx:
        if database.dialect == "postgres":
            await tx.fetch("SELECT pg_advisory_xact_lock(?)", (MIGRATION_LOCK_KEY,))
        await tx.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
            "name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)"
        )
        done = {row[0] for row in await tx.fetch("SELECT version FROM schema_migrations")}
        for migration in sorted(migrations, key=lambda m: m.version):
            if migration.version in done:
                continue
            for statement in migration.sql(database.dialect):
                await tx.execute(statement)
            await tx.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                (migration.version, migration.name, now_s),
            )
            applied.append(migration.version)
    return applied
