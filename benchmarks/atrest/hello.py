"""Ray Serve's hello world, the at-rest suite's baseline: one deployment answering "ok", with
Serve's defaults, nothing of ours imported (`serve run benchmarks.atrest.hello:app` starts it as
the docs' example is started)."""

from __future__ import annotations

from ray import serve
from starlette.requests import Request


@serve.deployment
class Hello:
    def __call__(self, request: Request) -> str:
        return "ok"


# Ray 2.60 types the decorator as its factory even given a class (see deployments.app's
# as_deployment, not imported here: the baseline loads nothing of ours).
app = Hello.bind()  # type: ignore[attr-defined]
