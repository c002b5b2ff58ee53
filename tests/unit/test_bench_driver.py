"""The benchmark process never attaches to Ray on its own: a suite's handle thread still polling
after the suite detached would otherwise re-attach, and stopping the cluster would end the
process before its report is printed (benchmarks/__init__.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from deployments.config import PROJECT_ROOT


def test_importing_the_benchmarks_first_turns_rays_auto_connect_off():
    # A fresh interpreter, as `python -m benchmarks.run` is: the package is imported before Ray.
    probe = (
        "import benchmarks.run, ray._private.auto_init_hook as hook; "
        "print(hook.enable_auto_connect)"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_AUTO_CONNECT"}
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert result.stdout.strip().splitlines()[-1] == "False"
