"""A chat replica's KV budget: how many bytes its sequences' caches (and, on the plain layout, its
prefix cache) may hold, checked against the host's memory and the model when it is set. The
scheduler admits and preempts against it; each step runner says what a batch would hold
(`kv_bytes`), since the two cache layouts grow differently.

Bytes per cached position come from the manifest's `KVCacheLayout`: one key and one value vector
per layer and KV head.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from deployments.contracts.manifest import KVCacheLayout

MIB = 1 << 20


def bytes_per_position(layout: KVCacheLayout, itemsize: int) -> int:
    """One cached position of one sequence, over all layers."""
    return (
        layout.num_layers
        * layout.num_kv_heads
        * (layout.key_head_dim + layout.value_head_dim)
        * itemsize
    )


def host_memory_bytes() -> int:
    """Physical memory of this host (not of a container's limit: the budget is checked against
    the machine, the replica's share of it is the operator's call)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def rounded_up(positions: int, step: int) -> int:
    return -(-positions // step) * step


@dataclass
class KVBudget:
    """The limit, shared by the scheduler (admission, preemption) and the step runner (the
    prefix cache's room). `limit_bytes` None: no limit, as before budgets existed. `preemptions`
    counts sequences whose cache was dropped to keep within it."""

    limit_bytes: int | None = None
    preemptions: int = 0

    def set_limit(
        self,
        limit_bytes: int | None,
        *,
        longest_sequence_bytes: int,
        context_length: int,
        host_bytes: int | None = None,
    ) -> None:
        """A new limit (a replica's start or a live config change), refused with the numbers
        when the host cannot hold it or one sequence of the model's whole context would not fit
        in it (that sequence could never run)."""
        if limit_bytes is not None:
            check_limit(
                limit_bytes,
                longest_sequence_bytes=longest_sequence_bytes,
                context_length=context_length,
                host_bytes=host_memory_bytes() if host_bytes is None else host_bytes,
            )
        self.limit_bytes = limit_bytes

    def fits(self, nbytes: int) -> bool:
        return self.limit_bytes is None or nbytes <= self.limit_bytes


def check_limit(
    limit_bytes: int, *, longest_sequence_bytes: int, context_length: int, host_bytes: int
) -> None:
    if limit_bytes <= 0:
        raise ValueError("kv_budget_mb must be more than 0 (or unset: no budget)")
    if limit_bytes > host_bytes:
        raise ValueError(
            f"kv_budget_mb={limit_bytes / MIB:.0f} exceeds this host's memory "
            f"({host_bytes / MIB:.0f} MiB); lower it or give the model a larger host"
        )
    if longest_sequence_bytes > limit_bytes:
        raise ValueError(
            f"kv_budget_mb={limit_bytes / MIB:.0f} cannot hold one sequence of this model's "
            f"context ({context_length} positions need {longest_sequence_bytes / MIB:.1f} MiB); "
            f"raise it to at least {-(-longest_sequence_bytes // MIB)}"
        )
