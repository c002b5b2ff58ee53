"""The at-size suite's cold start: `serve run` of a temp copy of serve_config.yaml (as the at-rest
suite starts it, its own ports and state folder) whose `model` serves its at-size export, that
model's pools back at zero `cold_idle_delay_s` after each request; then its cold cycles through
the HTTP port (benchmarks.atrest.cold_cycles: one token of a chat answer, timed by the client
from zero).

Alone, without the rest of the suite (the at-size exports built already: `make models-large`):
    python -m benchmarks.at_size.cold_start --model glm --cycles 10
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from benchmarks.at_size.config import (
    AT_SIZE_MODELS,
    AtSizeBenchConfig,
    parse_tool_args,
    tool_parser,
)
from benchmarks.at_size.models import point_at_export
from benchmarks.atrest import cold_cycles, serve_files
from benchmarks.atrest.serve_run import serve_run
from benchmarks.atrest.suite import cold_starts as timed_cold_starts
from edgectl.local_cluster import free_port

log = logging.getLogger(__name__)


def cold_start_config(config: AtSizeBenchConfig, model: str, data_dir: Path) -> dict[str, Any]:
    """The shipped config on ports of its own, `model` at size, its pools quick back to zero."""
    shipped = yaml.safe_load(config.serve_config.read_text())
    copy = serve_files.ours(shipped, config.models_dir, data_dir, free_port(), free_port(), None)
    (app,) = copy["applications"]
    point_at_export(config, app["args"]["models"], model)
    serve_files.set_model_idle_delay(copy, model, config.cold_idle_delay_s)
    return copy


def cold_starts(config: AtSizeBenchConfig, model: str) -> dict[str, Any]:
    """`model`'s cold cycles at size (p50_s, p90_s and each cycle), or the error that ended them."""
    with tempfile.TemporaryDirectory(prefix="bench-at-size-cold-") as tmp:
        root = Path(tmp)
        copy = cold_start_config(config, model, root / "data")
        workdir = root / "run"
        workdir.mkdir()
        try:
            with serve_run(copy, workdir, config.ray_num_cpus, config.deploy_timeout_s) as run:
                timed = timed_cold_starts(config, run, copy, cold_cycles.chat_request(model))
        except (RuntimeError, TimeoutError, OSError) as error:  # `serve run` never ran it
            log.exception("%s at size: serve run failed", model)
            return {"error": repr(error)}
    log.info(
        "%s at size, cold starts: p50 %s s, p90 %s s", model, timed.get("p50_s"), timed.get("p90_s")
    )
    return timed


def main() -> None:
    parser = tool_parser(__doc__)
    parser.add_argument("--model", choices=AT_SIZE_MODELS, default="glm")
    parser.add_argument("--cycles", type=int, default=10)
    args = parse_tool_args(parser)
    config = AtSizeBenchConfig(
        models_dir=args.models_dir.resolve(),
        at_size_dir=args.at_size_dir,
        models=[args.model],
        cold_cycles=args.cycles,
    )
    # Ray's chatter (a raylet's warnings reach the driver's stdout) would corrupt the JSON.
    with contextlib.redirect_stdout(sys.stderr):
        timed = cold_starts(config, args.model)
    print(json.dumps({"model": args.model, **timed}, indent=2))


if __name__ == "__main__":
    main()
