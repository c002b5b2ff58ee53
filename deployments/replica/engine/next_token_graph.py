"""A decoder graph rewritten to compute logits for the last position only.

Exported decoders return logits for every input position (the exporter's parity checks compare
them all), but generation needs only the last row. In a prefill the rest is waste: the
language-model head multiplies every prompt position by a [hidden, vocab] matrix and writes
positions x vocab floats. Slicing the hidden state to its last position before that product
changes nothing else in the graph. Measured on the default tiny GLM (1 thread): an 18-token
prefill 0.27 -> 0.22 ms, eight of them left-padded in one run 1.5-1.7 -> 0.95 ms.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

LOGITS = "logits"
# Ops between the head's product and the logits output that act on each position alone.
_PER_POSITION = frozenset({"Cast"})
_PREFIX = "next_token_"


def next_token_only(graph_path: Path) -> bytes | None:
    """The serialised graph whose `logits` output is [batch, 1, vocab] (the last position), or
    None where the head is not a plain `MatMul(hidden, weight)` (quantised graphs, say): those
    are run as exported, as is every graph where the `onnx` package is not installed. External
    weights stay where they are (not loaded here)."""
    try:
        import onnx  # the serving extras carry it; a bare onnxruntime install still runs
        from onnx import helper, numpy_helper
    except ImportError:
        log.info("onnx is not installed: %s keeps logits for every position", graph_path)
        return None
    model = onnx.load(str(graph_path), load_external_data=False)
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    node = producer.get(LOGITS)
    while node is not None and node.op_type in _PER_POSITION:
        node = producer.get(node.input[0])
    weights = {init.name for init in graph.initializer}
    if node is None or node.op_type != "MatMul" or node.input[1] not in weights:
        log.info("%s: no plain language-model head found; logits for every position", graph_path)
        return None
    last, end, axis = (f"{_PREFIX}{name}" for name in ("start", "end", "axis"))
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.array([-1], np.int64), last),
            numpy_helper.from_array(np.array([np.iinfo(np.int64).max], np.int64), end),
            numpy_helper.from_array(np.array([1], np.int64), axis),  # the sequence axis
        ]
    )
    hidden = f"{_PREFIX}hidden"
    position = list(graph.node).index(node)
    graph.node.insert(
        position,
        helper.make_node("Slice", [node.input[0], last, end, axis], [hidden], _PREFIX + "slice"),
    )
    node.input[0] = hidden
    output = next(o for o in graph.output if o.name == LOGITS)
    output.type.tensor_type.shape.dim[1].Clear()
    output.type.tensor_type.shape.dim[1].dim_value = 1
    return model.SerializeToString()
