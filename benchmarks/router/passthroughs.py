"""The ingresses our router is compared with in the router suite: a pass-through with the same two
hops and no logic (FastAPI, and plain `__call__`), and the moderation model as its own ingress."""

# No `from __future__ import annotations`: FastAPI must see `Request` itself in the signatures
# Ray Serve rewrites for the class-based ingress, not the string "Request".
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.serve import Application
from starlette.requests import Request
from starlette.responses import JSONResponse

from deployments.app import as_deployment
from deployments.contracts.encoder_outputs import ModerationResult
from deployments.contracts.moderation_deployment import ClassifyRequest, ModerationClient
from deployments.contracts.replies import Reply
from deployments.replica.batched import ModerationServer
from deployments.replica.engine.session import SessionConfig

# The router's share of a node in serve_config.yaml: the baselines get the same.
INGRESS_NUM_CPUS = 0.1

passthrough_api = FastAPI(title="moderation pass-through")


def _texts(body: dict[str, Any]) -> list[str]:
    value = body["input"]
    return [value] if isinstance(value, str) else list(value)


def _results_body(reply: Reply[list[ModerationResult]]) -> JSONResponse:
    return JSONResponse({"results": [asdict(result) for result in reply.value]})


def _moderation_handle(app_name: str, deployment: str) -> ModerationClient:
    # The SAME deployment our router calls, in the other application: only the ingress differs.
    return ModerationClient(serve.get_deployment_handle(deployment, app_name=app_name))


@serve.ingress(passthrough_api)
class FastAPIPassThrough:
    """Body in, `classify`, JSON out, behind FastAPI like our router: what is left of the
    router's latency once its own logic (validation, response models, error mapping) is gone."""

    def __init__(self, app_name: str, deployment: str):
        self.moderation = _moderation_handle(app_name, deployment)

    @passthrough_api.post("/v1/moderations")
    async def moderations(self, request: Request) -> JSONResponse:
        texts = _texts(await request.json())
        return _results_body(await self.moderation.classify(ClassifyRequest(texts)))


class PlainPassThrough:
    """The same forwarding without FastAPI: Ray Serve hands `__call__` the Starlette request."""

    def __init__(self, app_name: str, deployment: str):
        self.moderation = _moderation_handle(app_name, deployment)

    async def __call__(self, request: Request) -> JSONResponse:
        texts = _texts(await request.json())
        return _results_body(await self.moderation.classify(ClassifyRequest(texts)))


class ModerationIngress(ModerationServer):
    """The moderation replica taking HTTP itself: one hop, the floor under both ingresses."""

    async def __call__(self, request: Request) -> JSONResponse:
        texts = _texts(await request.json())
        return _results_body(await self.classify(ClassifyRequest(texts)))


def build_fastapi_passthrough(args: dict[str, Any]) -> Application:
    deployment = as_deployment(FastAPIPassThrough).options(
        ray_actor_options={"num_cpus": INGRESS_NUM_CPUS}
    )
    return deployment.bind(args["app_name"], args["deployment"])


def build_plain_passthrough(args: dict[str, Any]) -> Application:
    deployment = as_deployment(PlainPassThrough).options(
        ray_actor_options={"num_cpus": INGRESS_NUM_CPUS}
    )
    return deployment.bind(args["app_name"], args["deployment"])


def build_moderation_ingress(args: dict[str, Any]) -> Application:
    session = SessionConfig(provider="cpu", intra_op_threads=args["intra_op_threads"])
    deployment = as_deployment(ModerationIngress).options(
        name=args["name"], ray_actor_options={"num_cpus": args["num_cpus"]}
    )
    return deployment.bind(args["model_dir"], session)
