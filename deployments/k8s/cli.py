"""`python -m deployments.k8s render [--check]`: write the manifests of k8s/, or fail (exit 1,
with a diff) when the committed ones differ from a fresh render."""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from deployments.k8s.render import RenderSources, render


def _parser(prog: str = "python -m deployments.k8s") -> argparse.ArgumentParser:
    defaults = RenderSources.of_repo()
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("render", help="write the generated manifests (or --check them)")
    p.add_argument("--config", type=Path, default=defaults.serve_config)
    p.add_argument("--templates", type=Path, default=defaults.templates)
    p.add_argument("--pyproject", type=Path, default=defaults.pyproject)
    p.add_argument("--out", type=Path, default=defaults.out_dir, help="the folder written")
    p.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a manifest differs"
    )
    return parser


def _stale(path: Path, fresh: str) -> bool:
    committed = path.read_text() if path.is_file() else ""
    if committed == fresh:
        return False
    diff = difflib.unified_diff(
        committed.splitlines(keepends=True),
        fresh.splitlines(keepends=True),
        fromfile=f"{path} (committed)",
        tofile="fresh render",
    )
    sys.stdout.writelines(diff)
    return True


def main(argv: list[str] | None = None, prog: str = "python -m deployments.k8s") -> int:
    args = _parser(prog).parse_args(argv)
    sources = RenderSources(args.config, args.templates, args.pyproject, args.out)
    manifests = render(sources)
    if not args.check:
        for name, text in manifests.items():
            path = sources.out_dir / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
        return 0
    stale = [name for name, text in manifests.items() if _stale(sources.out_dir / name, text)]
    if stale:
        print(
            f"stale in {sources.out_dir}: {', '.join(stale)}: "
            "run `python -m deployments.k8s render`",
            file=sys.stderr,
        )
        return 1
    print(f"{sources.out_dir}: {len(manifests)} manifests up to date")
    return 0
