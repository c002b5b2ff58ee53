"""The chat suite's peer: what a user would deploy instead, written the way the Ray Serve docs show
it. `transformers` `generate()` per request on the same tiny GLM our export builds, deployed beside
our app, behind the same proxy."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from ray.serve import Application
from starlette.requests import Request

from benchmarks.lib.edge_app import peer_application as beside
from deployments.app import as_deployment

PEER_APP = "peer-chat"
PEER_ROUTE = "/peer/chat"
PEER_DEPLOYMENT = "DocsPatternChat"
PEER_MODEL = "glm"  # the exporter builds this one's weights from a seed, so the peer can too


class DocsPatternChat:
    """`transformers` `generate()` per request on the same tiny GLM our export builds (the
    exporter's own seeded constructor), prompt encoded with the served model's chat template."""

    def __init__(self, model_dir: str):
        from deployments.contracts.manifest import ModelManifest
        from deployments.export.llm import default_model
        from deployments.replica.engine.tokenizer import ChatTokenizer

        with tempfile.TemporaryDirectory() as scratch:
            model, _ = default_model("glm", Path(scratch))
        self._model: Any = model  # a transformers causal LM (its generate() is untyped here)
        self._model.eval()
        # The served model's tokenizer and chat template: the prompt ids are ours, token for token.
        manifest = ModelManifest.load(Path(model_dir))
        assert manifest.llm is not None
        self._tokenizer = ChatTokenizer.from_manifest(model_dir, manifest)
        self._eos = list(manifest.llm.eos_token_ids)

    def greedy(self, prompt: list[int], new_tokens: int) -> list[int]:
        """Greedy ids, to check that this is the same model as the ONNX graph."""
        import torch

        with torch.inference_mode():
            out = self._model.generate(
                torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False
            )
        return [int(t) for t in out[0, len(prompt) :]]

    def _generate(self, messages: list[dict[str, Any]], max_tokens: int, seed: int) -> dict:
        import torch

        prompt = self._tokenizer.encode_chat(messages)
        torch.manual_seed(seed)
        with torch.inference_mode():
            out = self._model.generate(
                torch.tensor([prompt]),
                max_new_tokens=max_tokens,
                do_sample=True,
                temperature=0.7,
                eos_token_id=self._eos,
                pad_token_id=self._eos[0],
            )
        ids = [int(t) for t in out[0, len(prompt) :] if int(t) not in self._eos]
        return {
            "choices": [{"message": {"role": "assistant", "content": self._tokenizer.decode(ids)}}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids)},
        }

    async def __call__(self, request: Request) -> dict[str, Any]:
        body = await request.json()
        return await asyncio.to_thread(
            self._generate, body["messages"], int(body["max_tokens"]), int(body.get("seed", 0))
        )


def build_docs_chat(args: dict[str, Any]) -> Application:
    return as_deployment(DocsPatternChat).bind(args["model_dir"])


def peer_application(edge: dict[str, Any]) -> dict[str, Any]:
    return beside(
        edge,
        PEER_MODEL,
        name=PEER_APP,
        route=PEER_ROUTE,
        builder="benchmarks.chat.peer:build_docs_chat",
        deployment=PEER_DEPLOYMENT,
    )
