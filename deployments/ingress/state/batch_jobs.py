"""Batch jobs (tables `batch_jobs`, `batch_items`): Workers AI's asynchronous Batch API, kept in
the gateway's database so every router replica can answer a poll and run a job.

A job is `queued` until a replica claims it: one conditional UPDATE sets `running` with the
claimer's lease (`lease_owner`, `lease_until`), so two replicas never hold a job at once, and a
job whose lease ran out (its replica died) is claimable again. Each item's response is written
as it completes, with the lease renewed in the same transaction (a replica that lost its lease
writes nothing), so a job taken over resumes from its first unfinished item. A job is `done`
once every item has a response; its results expire `result_ttl_s` later (`expired`: a
tombstone without items, answering 410 until pruned)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from deployments.ingress.state.database import Database, Row

BatchStatus = Literal["queued", "running", "done", "expired"]
_JOB_COLUMNS = (
    "id, key_id, model, served_model, status, item_count, created_at, updated_at, expires_at, "
    "lease_owner, lease_until"
)
# Claimable: queued, or running under a lease that ran out.
_CLAIMABLE = "(status = 'queued' OR (status = 'running' AND lease_until < ?))"


@dataclass(frozen=True)
class BatchJob:
    id: str
    key_id: str
    model: str  # as the client named it
    served_model: str  # the deployment's name: a job is claimed while this one is warm
    status: BatchStatus
    item_count: int
    created_at: float
    updated_at: float
    expires_at: float | None
    lease_owner: str | None
    lease_until: float | None

    @classmethod
    def from_row(cls, row: Row) -> BatchJob:
        job_id, key_id, model, served, status, count, created, updated, expires, owner, until = row
        return cls(
            job_id, key_id, model, served, status, int(count), created, updated, expires, owner,
            until,
        )  # fmt: skip

    def expired(self, now_s: float) -> bool:
        return self.status == "expired" or (
            self.expires_at is not None and now_s >= self.expires_at
        )


@dataclass(frozen=True)
class BatchItem:
    """One request of a job: its index in the submitted `requests`, and its input as given
    (without `external_reference`, which is kept apart and returned with its response)."""

    index: int
    input: dict[str, Any]
    external_reference: Any = None


@dataclass(frozen=True)
class ItemResult:
    index: int
    response: dict[str, Any] | None  # None: not run yet
    external_reference: Any
    prompt_tokens: int
    completion_tokens: int


class BatchJobs:
    def __init__(self, database: Database):
        self._db = database

    async def create(
        self,
        job_id: str,
        key_id: str,
        model: tuple[str, str],
        items: Sequence[BatchItem],
        now_s: float,
    ) -> BatchJob:
        """`model`: as the client named it, and the served model's name."""
        row = (job_id, key_id, *model, "queued", len(items), now_s, now_s, None, None, None)
        async with self._db.transaction() as tx:
            await tx.execute(
                f"INSERT INTO batch_jobs ({_JOB_COLUMNS}) VALUES ({', '.join('?' for _ in row)})",
                row,
            )
            await tx.execute_many(
                "INSERT INTO batch_items (job_id, idx, input, external_reference) "
                "VALUES (?, ?, ?, ?)",
                [
                    (
                        job_id,
                        item.index,
                        json.dumps(item.input),
                        json.dumps(item.external_reference),
                    )
                    for item in items
                ],
            )
        return BatchJob.from_row(row)

    async def get(self, job_id: str) -> BatchJob | None:
        rows = await self._db.fetch(
            f"SELECT {_JOB_COLUMNS} FROM batch_jobs WHERE id = ?", (job_id,)
        )
        return BatchJob.from_row(rows[0]) if rows else None

    async def claim(
        self, owner: str, models: Sequence[str], now_s: float, lease_s: float
    ) -> BatchJob | None:
        """The oldest claimable job of one of the served `models`, now running under `owner`'s
        lease; None if there is none. One statement: of replicas claiming at once, one gets a
        given job (PostgreSQL re-checks the condition on the row the winner changed; SQLite
        writes one at a time)."""
        if not models:
            return None
        names = ", ".join("?" for _ in models)
        rows = await self._db.fetch(
            "UPDATE batch_jobs SET status = 'running', lease_owner = ?, lease_until = ?, "
            "updated_at = ? WHERE id = (SELECT id FROM batch_jobs WHERE served_model IN "
            f"({names}) AND {_CLAIMABLE} ORDER BY created_at, id LIMIT 1) AND {_CLAIMABLE} "
            f"RETURNING {_JOB_COLUMNS}",
            (owner, now_s + lease_s, now_s, *models, now_s, now_s),
        )
        return BatchJob.from_row(rows[0]) if rows else None

    async def renew(self, job_id: str, owner: str, now_s: float, lease_s: float) -> bool:
        """Extend `owner`'s lease; False if it holds it no more (another replica took over)."""
        changed = await self._db.execute(
            "UPDATE batch_jobs SET lease_until = ?, updated_at = ? "
            "WHERE id = ? AND lease_owner = ? AND status = 'running'",
            (now_s + lease_s, now_s, job_id, owner),
        )
        return changed > 0

    async def release(self, job_id: str, owner: str, now_s: float) -> bool:
        """Give the job back to the queue (no warm capacity for it now): `queued` again."""
        changed = await self._db.execute(
            "UPDATE batch_jobs SET status = 'queued', lease_owner = NULL, lease_until = NULL, "
            "updated_at = ? WHERE id = ? AND lease_owner = ? AND status = 'running'",
            (now_s, job_id, owner),
        )
        return changed > 0

    async def pending(self, job_id: str, limit: int) -> list[BatchItem]:
        """The first `limit` items without a response, in order."""
        rows = await self._db.fetch(
            "SELECT idx, input, external_reference FROM batch_items "
            "WHERE job_id = ? AND response IS NULL ORDER BY idx LIMIT ?",
            (job_id, limit),
        )
        return [BatchItem(int(i), json.loads(body), json.loads(ref)) for i, body, ref in rows]

    async def record(
        self,
        job_id: str,
        owner: str,
        index: int,
        response: dict[str, Any],
        tokens: tuple[int, int],
        now_s: float,
        lease_s: float,
    ) -> bool:
        """Write one item's response and renew the lease, together; False (nothing written) if
        `owner` no longer holds the job."""
        async with self._db.transaction() as tx:
            held = await tx.execute(
                "UPDATE batch_jobs SET lease_until = ?, updated_at = ? "
                "WHERE id = ? AND lease_owner = ? AND status = 'running'",
                (now_s + lease_s, now_s, job_id, owner),
            )
            if not held:
                return False
            await tx.execute(
                "UPDATE batch_items SET response = ?, prompt_tokens = ?, completion_tokens = ? "
                "WHERE job_id = ? AND idx = ? AND response IS NULL",
                (json.dumps(response), tokens[0], tokens[1], job_id, index),
            )
        return True

    async def finish(self, job_id: str, owner: str, now_s: float, expires_at: float) -> bool:
        """Mark the job done if `owner` holds it and every item has its response."""
        changed = await self._db.execute(
            "UPDATE batch_jobs SET status = 'done', lease_owner = NULL, lease_until = NULL, "
            "updated_at = ?, expires_at = ? WHERE id = ? AND lease_owner = ? AND "
            "status = 'running' AND NOT EXISTS (SELECT 1 FROM batch_items "
            "WHERE job_id = ? AND response IS NULL)",
            (now_s, expires_at, job_id, owner, job_id),
        )
        return changed > 0

    async def results(self, job_id: str) -> list[ItemResult]:
        rows = await self._db.fetch(
            "SELECT idx, response, external_reference, prompt_tokens, completion_tokens "
            "FROM batch_items WHERE job_id = ? ORDER BY idx",
            (job_id,),
        )
        return [
            ItemResult(
                int(i),
                None if response is None else json.loads(response),
                json.loads(ref),
                int(prompt or 0),
                int(completion or 0),
            )
            for i, response, ref, prompt, completion in rows
        ]

    async def prune(self, now_s: float, tombstone_s: float) -> int:
        """Expire done jobs past their TTL (items deleted, the job kept as a tombstone) and
        delete tombstones `tombstone_s` past it; the number of jobs changed."""
        async with self._db.transaction() as tx:
            await tx.execute(
                "DELETE FROM batch_items WHERE job_id IN (SELECT id FROM batch_jobs "
                "WHERE status = 'done' AND expires_at <= ?)",
                (now_s,),
            )
            expired = await tx.execute(
                "UPDATE batch_jobs SET status = 'expired', updated_at = ? "
                "WHERE status = 'done' AND expires_at <= ?",
                (now_s, now_s),
            )
            deleted = await tx.execute(
                "DELETE FROM batch_jobs WHERE status = 'expired' AND expires_at <= ?",
                (now_s - tombstone_s,),
            )
        return expired + deleted
