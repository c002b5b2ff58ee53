"""How a model's ONNX graph is to be opened: provider, graph optimisation, threads, IO binding.

Apart from the session factory so the application builder and the router can build and check it
without loading ONNX Runtime; `deployments.replica.engine.session` opens the graph it describes.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Provider = Literal["auto", "cuda", "cpu"]


class SessionConfig(BaseModel):
    """How to open a model's ONNX graph. `auto` takes CUDA when onnxruntime-gpu sees a GPU."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: Provider = "auto"
    device_id: int = Field(default=0, ge=0)
    graph_optimization: Literal["disable", "basic", "extended", "all"] = "all"
    intra_op_threads: int = Field(default=0, ge=0, description="0 lets ONNX Runtime decide")
    inter_op_threads: int = Field(default=0, ge=0, description="0 lets ONNX Runtime decide")
    io_binding: bool | None = Field(
        default=None,
        description="bind outputs on the device, and keep decoders' KV cache there between "
        "steps. None: on CUDA only (on the CPU provider there is no copy to save and binding "
        "costs ~0.1 ms a step); true forces it on any provider, so CI runs the GPU's code",
    )
    profile_file_prefix: str | None = Field(
        default=None,
        description="write ONNX Runtime's per-op profile (one JSON file per session, on "
        "`end_profiling()`) under this path prefix: a development aid for finding which ops a "
        "step's time goes to (benchmarks.at_size.step_profile); every run pays for it",
    )
