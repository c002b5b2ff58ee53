"""What the warm pool needs to know of how a Ray worker starts.

- The worker setup hook's environment variable. The public `worker_process_setup_hook` field of
  a runtime_env is turned into it by `ray.init` only, not in a Serve deployment's runtime_env
  (Ray 2.60), so the app's runtime_env sets the variable itself. Its name is Ray's private
  `ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR`: read from there when this Ray has it, else
  2.60's name (the canary test fails first if it changed). Read when asked, not at import: the
  config checker imports the warm pool's settings without loading Ray.
- The module every Serve replica imports before it deserialises its deployment class, the
  heaviest part of a replica's imports: a worker preloads it while idle. Where this Ray has no
  such module the preload logs it and moves on.
"""

from __future__ import annotations

SETUP_HOOK_ENV_VAR = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"
SERVE_REPLICA_MODULE = "ray.serve._private.replica"


def setup_hook_env_var() -> str:
    """The environment variable a Ray worker reads its setup hook from."""
    try:
        from ray._private import ray_constants
    except ImportError:
        return SETUP_HOOK_ENV_VAR
    name: str = getattr(ray_constants, "WORKER_PROCESS_SETUP_HOOK_ENV_VAR", SETUP_HOOK_ENV_VAR)
    return name
