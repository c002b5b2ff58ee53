"""Serve configs against each other at size: the at-size GLM (fp32) served by each config's
application as the at-size suite serves it, ours only, `--rounds` rounds with the configs'
order alternating, each round a fresh cluster per config; per config the tokens/s of 16
requests at once over `--bursts` bursts per round (each after one single stream, as a suite run
times them), and their median.

    python -m benchmarks.at_size.config_ab OLD.yaml serve_config.yaml --rounds 2 --bursts 3

Writes one JSON document to stdout. For a change to a serve config's numbers (batch sizes,
slots, queues) that the at-size suite's vLLM rows would take 20 minutes to show.
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.at_size.config import AtSizeBenchConfig, parse_tool_args, tool_parser
from benchmarks.at_size.load import chat_body, measure_side
from benchmarks.at_size.models import at_size_application
from benchmarks.at_size.suite import CHAT_PATH
from benchmarks.lib.edge_app import BYPASS_CACHE, our_url
from benchmarks.lib.http_load import Endpoint, async_client, ready
from benchmarks.lib.served import served

MODEL = "glm"

log = logging.getLogger(__name__)


def concurrent_tokens_per_s(config: AtSizeBenchConfig) -> list[float]:
    """`config.runs` bursts on a fresh cluster serving `config.serve_config`, after a warm-up."""
    with served(config, [at_size_application(config)]) as (base_url, _):
        endpoint = Endpoint(f"{our_url(config, base_url)}{CHAT_PATH}", BYPASS_CACHE)
        return asyncio.run(_bursts(config, endpoint))


async def _bursts(config: AtSizeBenchConfig, endpoint: Endpoint) -> list[float]:
    clock = time.perf_counter
    async with async_client(config.streams) as client:
        await ready(client, endpoint, chat_body(MODEL, 0, 2))
        await measure_side(config, client, endpoint, MODEL, -1000, clock)  # warm, as a suite
        figures = []
        for burst in range(config.runs):
            side = await measure_side(config, client, endpoint, MODEL, 1000 * (burst + 1), clock)
            figures.append(side["concurrent_tokens_per_s"])
    return figures


def compare(
    serve_configs: list[Path], rounds: int, bursts: int, models_dir: Path, at_size_dir: Path
) -> dict[str, Any]:
    measured: dict[str, list[float]] = {str(path): [] for path in serve_configs}
    for round_index in range(rounds):
        order = serve_configs if round_index % 2 == 0 else serve_configs[::-1]
        for path in order:
            config = AtSizeBenchConfig(
                models_dir=models_dir,
                at_size_dir=at_size_dir,
                models=[MODEL],
                runs=bursts,
                ttft_streams=1,
                serve_config=path,
            )
            figures = concurrent_tokens_per_s(config)
            log.info("round %d, %s: %s tokens/s at 16", round_index, path, figures)
            measured[str(path)].extend(figures)
    return {
        "model": MODEL,
        "rounds": rounds,
        "bursts": bursts,
        "concurrent_tokens_per_s": {
            path: {"bursts": figures, "median": statistics.median(figures)}
            for path, figures in measured.items()
        },
    }


def main() -> None:
    parser = tool_parser(__doc__)
    parser.add_argument("serve_configs", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--bursts", type=int, default=3)
    args = parse_tool_args(parser)
    report = compare(
        [path.resolve() for path in args.serve_configs],
        args.rounds,
        args.bursts,
        args.models_dir.resolve(),
        args.at_size_dir,
    )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
