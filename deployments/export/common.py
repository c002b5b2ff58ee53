"""What every exporter shares: a clean output directory and loud parity checks."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx


class VerificationError(RuntimeError):
    """`--verify` found the ONNX graph too far from the source model."""


def fresh_dir(out: str | Path) -> Path:
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    return out


def save_graph(model: onnx.ModelProto, path: Path) -> None:
    """`model` at `path` with its weights in `<path>.data` beside it. ONNX Runtime reads external
    weights straight into its tensors, where an inline graph is first parsed as one protobuf and
    its weights copied out of it: the embedding graph (86 MB) opens in 60-75 ms in a fresh
    process instead of 180-260 ms, with 87 MB less resident, which is a cold start's load."""
    weights = path.with_name(path.name + ".data")
    weights.unlink(missing_ok=True)  # onnx appends to a data file that is already there
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=weights.name,
        size_threshold=1024,
    )
    os.chmod(weights, path.stat().st_mode & 0o777)  # onnx creates it 0600; readable as the graph


def max_abs_diff(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.max(np.abs(actual.astype(np.float64) - expected.astype(np.float64))))


def check_close(what: str, actual: np.ndarray, expected: np.ndarray, atol: float) -> float:
    """Return the max abs difference, raising VerificationError past `atol`."""
    if actual.shape != expected.shape:
        raise VerificationError(f"{what}: shape {actual.shape} != expected {expected.shape}")
    diff = max_abs_diff(actual, expected)
    if not diff <= atol:  # also catches NaN
        raise VerificationError(f"{what}: max abs diff {diff:.3g} exceeds tolerance {atol:g}")
    return diff


def strip_trace_metadata(model: onnx.ModelProto) -> None:
    """Drop what the exporter records about the export run itself (stack traces with absolute
    paths, FX node dumps, the torch build's local version), so equal weights give equal bytes."""
    model.doc_string = ""
    del model.metadata_props[:]
    model.producer_name = "pytorch"
    model.producer_version = importlib.metadata.version("torch").split("+")[0]
    for function in model.functions:
        function.doc_string = ""
        del function.metadata_props[:]
        _strip_graph_nodes(function.node)
    _strip_graph(model.graph)


def _strip_graph(graph: onnx.GraphProto) -> None:
    graph.doc_string = ""
    del graph.metadata_props[:]
    for value in [*graph.input, *graph.output, *graph.value_info]:
        value.doc_string = ""
        del value.metadata_props[:]
    for tensor in graph.initializer:
        tensor.doc_string = ""
        del tensor.metadata_props[:]
    _strip_graph_nodes(graph.node)


def _strip_graph_nodes(nodes: Iterable[onnx.NodeProto]) -> None:
    for node in nodes:
        node.doc_string = ""
        del node.metadata_props[:]
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                _strip_graph(attribute.g)
            for subgraph in attribute.graphs:
                _strip_graph(subgraph)
