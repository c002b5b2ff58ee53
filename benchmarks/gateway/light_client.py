"""`python -m benchmarks.gateway.light_client`: key B's streams of the fairness part, sent one at a
time by a process of its own (fairness.one_at_a_time_apart starts it), so that their timing never
waits on the suite's event loop reading A's flood. Reads `{"caller": {url, headers, body},
"count": n, "gap_s": s}` as JSON on stdin; writes the StreamOutcome of each stream, in order, as
a JSON list on stdout."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time

from benchmarks.gateway.fairness import Caller, StreamOutcome, one_at_a_time
from benchmarks.lib.http_load import async_client


async def light_streams(caller: Caller, count: int, gap_s: float) -> list[StreamOutcome]:
    async with async_client(connections=1) as client:  # one stream at a time
        return await one_at_a_time(client, caller, count, gap_s, time.perf_counter)


def main() -> None:
    request = json.load(sys.stdin)
    caller = Caller(**request["caller"])
    outcomes = asyncio.run(light_streams(caller, int(request["count"]), float(request["gap_s"])))
    json.dump([dataclasses.asdict(outcome) for outcome in outcomes], sys.stdout)


if __name__ == "__main__":
    main()
