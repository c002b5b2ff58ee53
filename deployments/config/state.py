"""The `state:` settings (serve_config.yaml `args.state`): where the gateway keeps its keys,
budgets and request log, and how records reach the database (docs/gateway-state.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from deployments.config.strict import StrictModel

# The database URL, when set, wins over `state.database_url`: on Kubernetes it comes from a
# Secret, and a password never belongs in serve_config.yaml.
DATABASE_URL_ENV = "EDGE_DATABASE_URL"
POSTGRES_SCHEMES = ("postgresql://", "postgres://")

BudgetWhenStoreDown = Literal["lease", "admit", "refuse"]


class LedgerConfig(StrictModel):
    """The usage ledger and request log: one row per model request, written behind the
    request path in batches."""

    queue_max_records: int = Field(
        default=10_000,
        ge=1,
        le=10_000_000,
        description="records held while the database is slow or down (the batch being written "
        "included); past it new records are dropped and counted",
    )
    batch_max_records: int = Field(default=500, ge=1, le=100_000)
    flush_interval_s: float = Field(
        default=0.5, gt=0, le=60, description="the longest a record waits for its batch"
    )
    retry_max_s: float = Field(
        default=5.0, gt=0, le=300, description="the longest wait between tries while it fails"
    )
    retention_days: float = Field(
        default=30.0, gt=0, le=3650, description="rows older than this are pruned"
    )
    prune_interval_s: float = Field(default=3600.0, gt=0, le=86_400)


class BudgetLeaseConfig(StrictModel):
    """Budget leases (`budget_when_store_down: lease`): each router replica holds, per active key,
    a slice of the key's remaining budget reserved in the database ahead of need, admits the
    key's requests from it in memory, and spends only it while the database does not answer."""

    fraction: float = Field(
        default=0.1,
        gt=0,
        le=1,
        description="a slice is this share of the key's remaining budget (then min/max), and "
        "never less than the request that asks for it",
    )
    min_cost_units: float = Field(default=0.0, ge=0, description="the smallest slice")
    max_cost_units: float | None = Field(
        default=None, gt=0, description="the largest slice (none: no cap but the fraction)"
    )
    refill_below: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="a lease below this share of its last slice is topped up in the background",
    )
    idle_s: float = Field(
        default=60.0,
        gt=0,
        le=86_400,
        description="a lease no request used for this long goes back to the database",
    )
    refresh_interval_s: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="how often leases are topped up and idle ones returned; after a failed "
        "top-up, how long a request past its lease is refused without asking the database",
    )

    @model_validator(mode="after")
    def _min_below_max(self) -> BudgetLeaseConfig:
        if self.max_cost_units is not None and self.max_cost_units < self.min_cost_units:
            raise ValueError(
                f"budget_leases.max_cost_units ({self.max_cost_units:g}) is below "
                f"min_cost_units ({self.min_cost_units:g})"
            )
        return self


class BatchConfig(StrictModel):
    """Workers AI's asynchronous Batch API (`queueRequest`): jobs kept in the database and run
    by the router replicas on warm capacity only, behind interactive traffic (docs/api.md)."""

    enabled: bool = True
    max_requests: int = Field(
        default=1000, ge=1, le=100_000, description="the most requests one batch may hold"
    )
    result_ttl_s: float = Field(
        default=86_400.0,
        gt=0,
        le=30 * 86_400,
        description="how long a finished job's results can be polled (then 410 Gone)",
    )
    tombstone_s: float = Field(
        default=7 * 86_400.0,
        ge=0,
        le=365 * 86_400,
        description="how long an expired job still answers 410 rather than 404, then is pruned",
    )
    poll_interval_s: float = Field(
        default=1.0,
        gt=0,
        le=300,
        description="how often an idle runner looks for a job, and waits while capacity is busy",
    )
    max_in_flight: int = Field(
        default=1,
        ge=1,
        le=64,
        description="batch items each router replica sends at once (interactive traffic first)",
    )
    lease_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="a claimed job's lease: renewed after every item; past it, another "
        "replica takes the job over from its first unfinished item",
    )


class StateConfig(StrictModel):
    """Gateway state. No `database_url` (and no EDGE_DATABASE_URL): an embedded SQLite file
    under `data_dir`, enough for one machine; PostgreSQL to share it across nodes."""

    enabled: bool = True
    database_url: str | None = Field(
        default=None,
        description="postgresql://... (EDGE_DATABASE_URL wins); none: SQLite under data_dir",
    )
    sqlite_file: str = Field(default="gateway.sqlite3", min_length=1)
    connect_timeout_s: float = Field(default=5.0, gt=0, le=120)
    statement_timeout_s: float = Field(default=5.0, gt=0, le=600)
    keys_poll_interval_s: float = Field(
        default=0.25,
        gt=0,
        le=60,
        description="how often each router replica checks whether the keys table changed",
    )
    budget_reserve_timeout_s: float = Field(
        default=0.5,
        gt=0,
        le=30,
        description="the longest a request of a key with a budget waits for its reservation",
    )
    budget_when_store_down: BudgetWhenStoreDown = Field(
        default="lease",
        description="a key with a budget while the database does not answer: lease (served "
        "from this replica's lease of its budget, then 503; the lease also spares each "
        "request the database's round trip), admit (served, spend counted once it is back: "
        "unbounded) or refuse (503)",
    )
    budget_leases: BudgetLeaseConfig = BudgetLeaseConfig()
    ledger: LedgerConfig = LedgerConfig()
    batch: BatchConfig = BatchConfig()

    @field_validator("database_url")
    @classmethod
    def _postgres_only(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(POSTGRES_SCHEMES):
            # Never echo it: it may hold a password.
            raise ValueError("only postgresql:// URLs (leave it out for the SQLite file)")
        return url
