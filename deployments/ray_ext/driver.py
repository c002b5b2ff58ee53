"""What a benchmark's driver process needs of Ray beyond its public API.

- `reload_driver_auth`: Ray reads RAY_AUTH_MODE and the cluster token once, when imported; a
  driver that started its cluster after importing Ray must make it read them again, as Ray's
  own token-auth helpers do with `ray._raylet`'s `Config` and `AuthenticationTokenLoader` (no
  public call re-reads them).
- `deploy_applications`: `serve deploy`'s code path from inside a driver (Serve diffs the config
  against what runs, so a `user_config` change alone reconfigures live replicas, which
  `serve.run` does not: it gives every deployment a new code version). The public alternatives
  are the `serve deploy` CLI and the dashboard's `PUT /api/serve/applications/`, both this same
  call behind more processes.
Each raises `RuntimeError` naming what this Ray lacks.
"""

from __future__ import annotations

from typing import Any


def reload_driver_auth() -> None:
    try:
        from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]
    except ImportError as exc:
        raise RuntimeError(f"this Ray cannot re-read its auth token in process: {exc}") from exc
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def deploy_applications(schema: Any) -> None:
    """Deploy a `ServeDeploySchema` on the running Serve (returns before it runs)."""
    from ray.serve.context import _get_global_client

    client = _get_global_client()
    if client is None:
        raise RuntimeError("Serve is not running on this cluster")
    deploy = getattr(client, "deploy_apps", None)
    if deploy is None:
        raise RuntimeError("this Ray Serve's client has no deploy_apps")
    deploy(schema)
