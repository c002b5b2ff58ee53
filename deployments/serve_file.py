"""A whole serve config file: checked before `serve deploy` (`edge check`, `python -m
deployments.serve_file`), and narrowed by the tools that deploy part of it (benchmarks, tests)."""

from __future__ import annotations

import argparse
import copy
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from deployments.config.app import (
    APP_DEPLOYMENTS,
    ConfigError,
    describe_validation_error,
    parse_app_config,
)


def check_serve_config(path: str | Path) -> list[str]:
    """Everything wrong with a serve_config.yaml, as `where: what` lines (empty when valid):
    Ray Serve's own schema, then our `args` for every application built by build_app."""
    import yaml
    from ray.serve.schema import ServeDeploySchema

    try:
        raw = yaml.safe_load(Path(path).read_text())
        schema = ServeDeploySchema.model_validate(raw)
    except (OSError, yaml.YAMLError) as exc:
        return [f"{path}: {exc}"]
    except ValidationError as exc:
        return [describe_validation_error(exc, prefix="serve_config")]
    problems = []
    for app in schema.applications:
        if app.import_path == "deployments.app:build_app":
            try:
                built = {*parse_app_config(app.args or {}).model_deployments(), *APP_DEPLOYMENTS}
            except ConfigError as exc:
                problems.append(f"application {app.name!r}: {exc}")
            else:
                problems.extend(
                    f"application {app.name!r}: deployments: {d.name!r} is not a deployment of "
                    f"this app (it has {sorted(built)})"
                    for d in app.deployments
                    if d.name not in built
                )
        for deployment in app.deployments:
            problem = _keep_warm_problem(deployment.name, deployment.autoscaling_config)
            if problem:
                problems.append(f"application {app.name!r}: {problem}")
    return problems


def serve_only(args: dict[str, Any], models: Iterable[str]) -> None:
    """Narrow an application's raw `args` (in place) to `models`: their entries, their prices,
    and the moderation gate on only those of them it still can be (its moderation model kept).
    For tools that deploy part of serve_config.yaml (benchmarks, the region tests)."""
    kept = list(models)
    args["models"] = {name: args["models"][name] for name in kept}
    observability = args.get("observability", {})
    if "prices" in observability:
        observability["prices"] = {m: p for m, p in observability["prices"].items() if m in kept}
    gate = args.get("security", {}).get("moderation_gate")
    if gate is not None:
        moderation = gate.get("moderation_model", "moderation")
        gate["models"] = [m for m in gate.get("models", []) if m in kept and moderation in kept]


def set_router_listener(args: dict[str, Any], port: int | None, host: str = "127.0.0.1") -> None:
    """Point an application's raw `args` (in place) at its own listener `port`, or turn the
    listener off (None): a cluster a tool starts (a test's, a benchmark's) must not share the
    shipped port, which any same-user process binding it with SO_REUSEPORT would join."""
    args.setdefault("router", {})["listener"] = (
        {"enabled": True, "host": host, "port": port} if port is not None else {"enabled": False}
    )


def without_regions(serve_config: dict[str, Any], home: str) -> dict[str, Any]:
    """A copy of a serve config as one deployment per model (named after it), from the `home`
    region's `<model>-<home>` entries: what a config without `regions` is. For tools that measure
    one pool per model (benchmarks, the shared integration cluster)."""
    config = copy.deepcopy(serve_config)
    for app in config["applications"]:
        if app.get("import_path") != "deployments.app:build_app":
            continue
        edge = app["args"].get("edge", {})
        if "regions" not in edge:
            continue
        del edge["regions"]
        models = app["args"]["models"]
        kept = []
        for deployment in app.get("deployments", []):
            model, _, region = deployment["name"].rpartition("-")
            if model in models and region == home:
                kept.append({**deployment, "name": model})
            elif deployment["name"] in APP_DEPLOYMENTS:
                kept.append(deployment)
        app["deployments"] = kept
    return config


def _keep_warm_problem(deployment: str, scaling: Any) -> str | None:
    """Ray Serve builds a custom policy in its controller, where a bad schedule would only show
    in the controller's log: check the keep-warm schedule here, before deploying."""
    # The schedule's schema lives in the policy's module, which Serve pickles by value into its
    # controller; imported here, on use, so that loading the config loads no control-plane code.
    from deployments.control.keep_warm import KEEP_WARM_POLICY, KeepWarmConfig

    if hasattr(scaling, "model_dump"):
        scaling = scaling.model_dump()
    policy = scaling.get("policy") if isinstance(scaling, dict) else None
    if not isinstance(policy, dict) or policy.get("policy_function") != KEEP_WARM_POLICY:
        return None
    try:
        KeepWarmConfig.model_validate(policy.get("policy_kwargs") or {})
    except ValidationError as exc:
        where = f"deployments.{deployment}.autoscaling_config.policy.policy_kwargs"
        return describe_validation_error(exc, prefix=where)
    return None


def main(argv: Sequence[str] | None = None, prog: str = "python -m deployments.serve_file") -> int:
    """`python -m deployments.serve_file [FILE]` (or `edge check`): exit 1 on problems."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Check a Serve config file before `serve deploy`: Serve's schema, this "
        "application's args and keep-warm schedules. Exit 1 naming each problem's field.",
    )
    parser.add_argument("config", nargs="?", default="serve_config.yaml")
    target = parser.parse_args(argv).config
    found = check_serve_config(target)
    print("\n".join(found) if found else f"{target}: OK")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
