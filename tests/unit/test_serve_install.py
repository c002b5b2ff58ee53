"""What `make serve` installs on a bare clone is enough for the operator's `edge` command: its
install step names the `tools` extra, and `edge --help` runs in an interpreter where every module
of the extras only `make test` adds (`dev`, `otel`) is refused."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

from deployments.config import PROJECT_ROOT

MAKEFILE = (PROJECT_ROOT / "Makefile").read_text(encoding="utf-8")
PYPROJECT = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _recipe_extras(stamp: str) -> set[str]:
    """The extras the recipe of `$(STAMP):` installs with `pip install -e '.[...]'`."""
    recipe = re.search(rf"^\$\({stamp}\):.*\n((?:\t.*\n)+)", MAKEFILE, re.M)
    assert recipe is not None, f"no $({stamp}) recipe in the Makefile"
    (extras,) = re.findall(r"-e '\.\[([^\]]+)\]'", recipe.group(1))
    return {extra.strip() for extra in extras.split(",")}


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\[=<>!~ ;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_make_serve_installs_the_tools_extra_and_make_test_adds_only_test_tools() -> None:
    serve = _recipe_extras("SERVE_STAMP")
    assert "tools" in serve and "export" in serve
    assert _recipe_extras("DEV_STAMP") - serve == {"dev", "otel"}


def test_edge_help_needs_nothing_that_only_make_test_installs() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    serve_install = set()
    for extra in ("serve", "cpu", "export", "tools"):
        serve_install |= {_requirement_name(r) for r in extras[extra]}
    test_only = {_requirement_name(r) for r in extras["dev"] + extras["otel"]} - serve_install
    assert {"pytest", "openai"} <= test_only
    # A fresh interpreter refuses every top-level module those distributions provide.
    script = f"""
import importlib.abc, importlib.metadata, sys
test_only = {sorted(test_only)!r}
refused = {{module for module, dists in importlib.metadata.packages_distributions().items()
           if any(d.lower().replace('_', '-') in test_only for d in dists)}}
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in refused:
            raise ImportError(f'{{name}} comes only with make test')
        return None
sys.meta_path.insert(0, Refuse())
from edgectl.cli import main
sys.argv = ['edge', '--help']
main()
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage: edge" in done.stdout
