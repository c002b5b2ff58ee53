"""The embeddings suite's peer: what a user would deploy instead, written the way the Ray Serve
docs show it. PyTorch all-MiniLM-L6-v2 (the same packaged weights as our ONNX export), one
`@serve.batch`ed forward pass per batch, JSON out; deployed beside our app, behind one proxy."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ray import serve
from ray.serve import Application
from starlette.requests import Request

from benchmarks.lib.edge_app import peer_application as beside
from deployments.app import as_deployment

# The docs' batching parameters for an embedding model.
DOCS_MAX_BATCH_SIZE = 32
DOCS_BATCH_WAIT_TIMEOUT_S = 0.005

PEER_APP = "peer-embedding"
PEER_ROUTE = "/peer/embeddings"
PEER_DEPLOYMENT = "DocsPatternEmbedder"


class DocsPatternEmbedder:
    """transformers' default SDPA attention, `@serve.batch(32, 5 ms)`, torch at its default
    threads."""

    def __init__(self, model_dir: str):
        from benchmarks.lib.pytorch import pytorch_embedders
        from deployments.replica.engine.embedding import SentenceTokenizer

        tokenizer = SentenceTokenizer(Path(model_dir) / "tokenizer.json")
        self._embed = pytorch_embedders(tokenizer)["pytorch_sdpa"]

    @serve.batch(max_batch_size=DOCS_MAX_BATCH_SIZE, batch_wait_timeout_s=DOCS_BATCH_WAIT_TIMEOUT_S)
    async def embed(self, texts: list[str]) -> list[list[float]]:
        return [row.tolist() for row in await asyncio.to_thread(self._embed, texts)]

    async def __call__(self, request: Request) -> dict[str, Any]:
        body = await request.json()
        vector = await self.embed(body["input"])
        return {
            "object": "list",
            "data": [{"object": "embedding", "index": 0, "embedding": vector}],
        }


def build_docs_embedding(args: dict[str, Any]) -> Application:
    return as_deployment(DocsPatternEmbedder).bind(args["model_dir"])


def peer_application(edge: dict[str, Any]) -> dict[str, Any]:
    return beside(
        edge,
        "embedding",
        name=PEER_APP,
        route=PEER_ROUTE,
        builder="benchmarks.embeddings.peer:build_docs_embedding",
        deployment=PEER_DEPLOYMENT,
    )
