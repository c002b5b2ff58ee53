"""Pre-warming's one live assumption, on the session's cluster: a `hold` call in flight on a pool
(what edge-control keeps on a pool it pre-warms, deployments/control/prewarm.py) makes Serve's own
autoscaler start a replica from zero and keep it past the scale-to-zero delay, and once the hold
is cancelled the pool goes back to zero as usual. The forecaster and the warmer are unit-tested
(tests/unit/test_prewarm.py); `python -m benchmarks.run --suite prewarm` measures the policy."""

from __future__ import annotations

import subprocess
import sys
import time

from conftest import KIMI_TO_ZERO_S

from edgectl.local_cluster import wait_until

# A driver holding kimi the way edge-control does, until told to release (a line on stdin).
HOLD = """
import os, sys
os.environ["RAY_AUTH_MODE"] = "token"
import ray
from ray import serve
ray.init(address="auto", logging_level="ERROR")
response = serve.get_deployment_handle("kimi", "edge").hold.remote(240)
print("holding", flush=True)
sys.stdin.readline()
response.cancel()
try:
    response.result(timeout_s=60)  # raises once the cancel has reached the replica
except Exception as error:
    print("released", type(error).__name__, flush=True)
"""


def stays(condition, seconds: float, what: str) -> None:
    """`condition` holds at every look for `seconds` (a state that must last, not a wait; each
    look is a `serve status` call, a second or more)."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        assert condition(), what


def test_a_hold_in_flight_keeps_a_pool_at_one_replica_and_its_release_lets_it_go(serve_cluster):
    at_zero = lambda: serve_cluster.running_replicas("kimi") == 0  # noqa: E731
    one = lambda: serve_cluster.running_replicas("kimi") == 1  # noqa: E731
    wait_until(at_zero, 90, "kimi at zero replicas")
    driver = subprocess.Popen(
        [sys.executable, "-c", HOLD],
        env=serve_cluster.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert driver.stdout is not None and driver.stdin is not None
        assert driver.stdout.readline().strip() == "holding"
        wait_until(one, 120, "kimi started for the hold (Serve's cold-start fast path)")
        # Without a request kimi would be back at zero KIMI_TO_ZERO_S after this.
        stays(one, KIMI_TO_ZERO_S + 10, "kimi stayed at one replica while held")
        driver.stdin.write("release\n")
        driver.stdin.flush()
        assert driver.stdout.readline().startswith("released")
        wait_until(at_zero, 90, "kimi back at zero after the release")
    finally:
        driver.kill()
        driver.wait(30)
