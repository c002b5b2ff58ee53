"""`python -m deployments.export` - one command from a checkpoint to a servable model directory."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from deployments.export.common import VerificationError
from deployments.export.defaults import DEFAULT_MODELS, build_default, is_built
from deployments.export.progress import stages_for

NO_PROGRESS_HELP = "no progress bar (off anyway without a terminal)"


def _planned_stages(args: argparse.Namespace) -> list[str]:
    fused = getattr(args, "attention", "plain") == "fused"
    return (
        ["load", "export"]
        + ["quantise"] * bool(args.quantize)
        + ["prepack"] * fused
        + ["verify"] * args.verify
    )


def _parser(prog: str = "python -m deployments.export") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Export a checkpoint to ONNX (+ tokenizer + manifest), or build the defaults.",
    )
    sub = parser.add_subparsers(dest="model", required=True)
    for family in ("glm", "kimi"):
        p = sub.add_parser(family, help=f"{family} chat model (KV-cache decoder graph)")
        p.add_argument("--from", dest="source", help="HF id or local dir (default: tiny stand-in)")
        p.add_argument("--out", type=Path, required=True)
        p.add_argument("--dtype", choices=("fp32", "fp16"), default="fp32")
        p.add_argument(
            "--quantize",
            choices=("int8", "int4"),
            default=None,
            help="int8: quantize_dynamic (plain) or MatMulNBits (fused); int4: fused only",
        )
        p.add_argument(
            "--attention",
            choices=("plain", "fused"),
            default="plain",
            help="plain: torch.onnx graph, cache returned one longer; fused (GLM-4): "
            "GroupQueryAttention writes a slot cache in place, GEMM attention, CPU-prepacked",
        )
        p.add_argument("--verify", action="store_true", help="check parity with PyTorch")
        p.add_argument("--no-progress", action="store_true", help=NO_PROGRESS_HELP)
    emb = sub.add_parser("embedding", help="BERT-style sentence embedder (mean pooling + L2)")
    emb.add_argument("--from", dest="source", help="HF id or dir (default: packaged MiniLM)")
    emb.add_argument("--out", type=Path, required=True)
    emb.add_argument("--quantize", choices=("int8",), default=None)
    emb.add_argument("--verify", action="store_true")
    emb.add_argument(
        "--graph",
        choices=("fused", "plain"),
        default="fused",
        help="fused: ONNX Runtime's BERT fusions (default); plain: the unfused dynamo export",
    )
    emb.add_argument("--no-progress", action="store_true", help=NO_PROGRESS_HELP)
    mod = sub.add_parser("moderation", help="text moderation classifier")
    mod.add_argument("--from", dest="source", help="dir with the scikit-learn model")
    mod.add_argument("--out", type=Path, required=True)
    mod.add_argument("--verify", action="store_true")
    checkpoint = sub.add_parser(
        "checkpoint",
        help="a chat default's seeded weights as a PyTorch checkpoint (save_pretrained), for peers",
    )
    checkpoint.add_argument("family", choices=("glm", "kimi"))
    checkpoint.add_argument("--out", type=Path, required=True)
    large = sub.add_parser(
        "large",
        help="GLM-4 and Kimi-K2 stand-ins at size (real vocabularies, >= 300M parameters): "
        "checkpoints (save_pretrained) and their exports",
    )
    large.add_argument("--out", type=Path, default=Path("models-large"))
    large.add_argument(
        "--layers",
        type=int,
        default=None,
        help="layers per model (default: the stand-ins' own); full width and vocabulary kept, "
        "for a build in seconds (tests, the at-size suite's --quick)",
    )
    large.add_argument(
        "--only",
        action="append",
        choices=("glm", "glm-int8", "kimi"),
        help="build only this export (repeatable; default: every one)",
    )
    defaults = sub.add_parser("defaults", help="build every embedded default model")
    defaults.add_argument("--out", type=Path, default=Path("models"))
    defaults.add_argument("--force", action="store_true", help="rebuild even if present and intact")
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m deployments.export") -> int:
    args = _parser(prog).parse_args(argv)
    # Our progress at INFO; the exporters' libraries (onnx_ir, torch.onnx) only when they warn.
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("deployments").setLevel(logging.INFO)
    start = time.perf_counter()
    try:
        if args.model == "defaults":
            for name in DEFAULT_MODELS:
                if not args.force and is_built(args.out, name):
                    print(f"{name}: up to date in {args.out / name}")
                    continue
                t0 = time.perf_counter()
                build_default(name, args.out)
                print(f"{name}: built in {time.perf_counter() - t0:.1f}s -> {args.out / name}")
            return 0
        if args.model == "large":
            from deployments.export.at_size import build_large

            for path in build_large(args.out, args.layers, args.only):
                print(f"{path.name}: built -> {path}")
            return 0
        if args.model == "checkpoint":
            from deployments.export.llm import save_checkpoint

            print(f"{args.family}: checkpoint -> {save_checkpoint(args.family, args.out)}")
            return 0
        if args.model in ("glm", "kimi", "embedding"):
            stages = stages_for(args.model, _planned_stages(args), enabled=not args.no_progress)
            try:
                if args.model == "embedding":
                    from deployments.export.embedding import export_embedding

                    export_embedding(
                        args.source,
                        args.out,
                        verify=args.verify,
                        quantize=args.quantize,
                        graph=args.graph,
                        stages=stages,
                    )
                else:
                    from deployments.export.llm import export_llm

                    export_llm(
                        args.model,
                        args.source,
                        args.out,
                        dtype=args.dtype,
                        quantize=args.quantize,
                        attention=args.attention,
                        verify=args.verify,
                        stages=stages,
                    )
            finally:
                stages.close()
        else:
            from deployments.export.moderation import export_moderation

            export_moderation(args.source, args.out, verify=args.verify)
    except VerificationError as exc:
        print(f"verification FAILED: {exc}", file=sys.stderr)
        return 2
    print(f"{args.model}: exported in {time.perf_counter() - start:.1f}s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
