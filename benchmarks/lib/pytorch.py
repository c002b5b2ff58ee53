"""The packaged embedding model in PyTorch, loaded by the exporter's own code: the baseline of the
ONNX Runtime embedder in process (benchmarks.runtime) and the docs-pattern peer's model
(benchmarks.embeddings.peer)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from deployments.replica.engine.embedding import SentenceTokenizer

EmbedFn = Callable[[Sequence[str]], np.ndarray]


def pytorch_embedders(
    tokenizer: SentenceTokenizer, threads: int | None = None
) -> dict[str, EmbedFn]:
    """Eager attention (what was exported) and SDPA (transformers' default), so a goal against
    PyTorch is judged against the faster; on `threads` threads (None: torch's default)."""
    import torch
    from transformers import PreTrainedModel

    from deployments.export.embedding import MeanPooledEncoder, load_encoder, resolve_checkpoint

    if threads is not None:
        torch.set_num_threads(threads)
    checkpoint = resolve_checkpoint(None)
    eager = load_encoder(checkpoint)
    sdpa = load_encoder(checkpoint)
    assert isinstance(sdpa, PreTrainedModel)  # load_encoder's return type is the nn.Module base
    sdpa.set_attn_implementation("sdpa")

    def embedder(encoder: torch.nn.Module) -> EmbedFn:
        pooled: torch.nn.Module = MeanPooledEncoder(encoder).eval()

        def embed(texts: Sequence[str]) -> np.ndarray:
            # Same tokenizer and padding as the ONNX path, so only the forward pass differs.
            batch = tokenizer.batch(texts)
            with torch.inference_mode():
                return pooled(
                    torch.from_numpy(batch.input_ids), torch.from_numpy(batch.attention_mask)
                ).numpy()

        return embed

    return {"pytorch_eager": embedder(eager), "pytorch_sdpa": embedder(sdpa)}
