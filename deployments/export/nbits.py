"""Weights for the fused graph: MatMulNBits int8/int4 (`--quantize`), and the graph optimised once
for ONNX Runtime's CPU provider with its prepacked weights saved to a file, so a replica maps them
instead of packing a private copy at every load."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import onnx
import onnxruntime as ort

from deployments.export.common import save_graph

NBits = Literal["int8", "int4"]
BITS = {"int8": 8, "int4": 4}
# Measured in the prototype (/work/scratch/engine/README.md, GLM-4 stand-in, 2 cores): blocks of
# 128 with int8 activations (accuracy level 4) were the fastest at 16 rows (int4 255 tok/s, int8
# 217, fp32 130); blocks of 32 gave 195. Accuracy level 1 (fp32 compute) costs 2x for int4 and
# 100x for int8, and quality on random weights was the same.
BLOCK_SIZE = 128
ACCURACY_LEVEL = 4
PREPACKED_GRAPH = "model.cpu-prepacked.onnx"
# Initializers of at least this size go to the prepacked graph's data file. With 1,024 (the
# prototype's value) ONNX Runtime 1.31 saved a tiny MatMulNBits graph whose logits are all NaN
# (the scales of a 128-wide layer are exactly 1,024 bytes); 64 keeps only shape constants inline
# (shape inference needs them in the graph) and every weight, scale and prepacked blob external.
EXTERNAL_MIN_BYTES = 64


def quantize_matmul_nbits(path: Path, quantize: NBits) -> None:
    """Every MatMul with a constant weight (the head included) -> MatMulNBits, symmetric, in
    place. The embedding Gather stays float: it reads one row per token."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = onnx.load(str(path), load_external_data=True)
    quantizer = MatMulNBitsQuantizer(
        model,
        bits=BITS[quantize],
        block_size=BLOCK_SIZE,
        is_symmetric=True,
        accuracy_level=ACCURACY_LEVEL,
    )
    quantizer.process()
    del model
    save_graph(quantizer.model.model, path)


def save_cpu_prepacked(path: Path, threads: int = 1) -> Path:
    """Optimise the graph for the CPU provider once and save it beside `path` with the prepacked
    MatMul weights in its data file (session.save_external_prepacked_constant_initializers): a
    session that loads it with optimisation off maps those blobs (shared between replicas through
    the page cache) where a session of the plain graph packs a private copy (int4 in the
    prototype: 0.15 GB private + 0.49 GB file-backed against 0.39 GB private, load 0.26 s against
    0.5 s, the same speed). The optimised graph is for the CPU provider only."""
    out = path.with_name(PREPACKED_GRAPH)
    data = out.with_name(out.name + ".data")
    data.unlink(missing_ok=True)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(out)
    for key, value in (
        ("session.save_external_prepacked_constant_initializers", "1"),
        ("session.optimized_model_external_initializers_file_name", data.name),
        (
            "session.optimized_model_external_initializers_min_size_in_bytes",
            str(EXTERNAL_MIN_BYTES),
        ),
    ):
        options.add_session_config_entry(key, value)
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return out
