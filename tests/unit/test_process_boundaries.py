"""Which process runs which folder, as a rule on the import graph and at run time.

- `deployments/ingress/` runs in the router process, `deployments/replica/` in the model
  replicas, `deployments/control/` in the control plane's deployments and Serve's controller;
  `deployments/contracts/` is what crosses a Ray call between them.
- No process folder imports another; the contracts import none of them.
- The one exception is the router's in-process moderation classifier, which runs the moderation
  engine beside the router (`ingress/security/gate_classifier.py`, imported on first use).

The static rule reads every import in the source, lazy ones too; the run-time rule imports the
router's entry points in a fresh interpreter (what this test process already loaded cannot hide a
heavy import) and looks at what came with them."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "deployments"
PROCESS_FOLDERS = ("ingress", "replica", "control")
# (importer, imported): the router's moderation classifier runs the moderation engine in the
# router process, on purpose: one short ONNX call instead of a Ray call per gated request.
ALLOWED_CROSSINGS = {
    ("deployments.ingress.security.gate_classifier", "deployments.replica.engine.moderation"),
}
# Heavy packages the router must not load: the model graphs, the grammar engine, the tokenizers.
HEAVY_PACKAGES = ("onnxruntime", "onnx", "torch", "transformers", "llguidance", "tokenizers")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_in(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module `source` (the text of `module`) imports, at the top or inside a function,
    as absolute names; `from a import b` counts `a` and `a.b` (b may be a module)."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                origin = ".".join([*base, node.module] if node.module else base)
            else:
                origin = node.module or ""
            found.add(origin)
            found.update(f"{origin}.{alias.name}" for alias in node.names)
    return found


def folder_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "deployments" and len(parts) > 1 else None


def crossings(imports: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(importer, imported) pairs where a process folder or the contracts reach into another
    process folder."""
    found = set()
    for importer, imported_modules in imports.items():
        side = folder_of(importer)
        if side not in (*PROCESS_FOLDERS, "contracts"):
            continue
        for imported in imported_modules:
            other = folder_of(imported)
            if other in PROCESS_FOLDERS and other != side:
                found.add((importer, imported))
    return found


def project_imports() -> dict[str, set[str]]:
    return {
        module_name(path): imports_in(
            path.read_text(), module_name(path), is_package=path.name == "__init__.py"
        )
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def allowed(crossing: tuple[str, str]) -> bool:
    importer, imported = crossing
    return any(
        importer == allowed_importer and (imported + ".").startswith(allowed_module + ".")
        for allowed_importer, allowed_module in ALLOWED_CROSSINGS
    )


def test_no_process_folder_imports_another() -> None:
    unexpected = {crossing for crossing in crossings(project_imports()) if not allowed(crossing)}
    assert not unexpected, sorted(unexpected)


def test_each_allowed_crossing_is_still_there() -> None:
    """An exception no longer used comes off the list, so the list says what is true."""
    assert crossings(project_imports()) >= ALLOWED_CROSSINGS


def test_the_rule_sees_a_lazy_and_a_relative_crossing() -> None:
    source = (
        "def f():\n    from deployments.replica.engine import llm\n\nfrom ...control import x\n"
    )
    imports = {
        "deployments.ingress.serving.probe": imports_in(source, "deployments.ingress.serving.probe")
    }
    assert {imported for _, imported in crossings(imports)} == {
        "deployments.replica.engine",
        "deployments.replica.engine.llm",
        "deployments.control",
        "deployments.control.x",
    }


def loaded_after(module: str) -> set[str]:
    """The names in sys.modules after importing `module` in a new interpreter."""
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def other_processes_code(loaded: set[str]) -> set[str]:
    heavy = {name for name in loaded if name.split(".")[0] in HEAVY_PACKAGES}
    return heavy | {name for name in loaded if folder_of(name) in ("replica", "control")}


@pytest.mark.parametrize(
    "module",
    [
        "deployments.config",
        "deployments.contracts",
        "deployments.ingress.api",
        "deployments.ingress.api.app",
        "deployments.ingress.router",
        # Serve loads a chat pool's request router in the process of every handle to it
        "deployments.contracts.session_router",
    ],
)
def test_the_router_process_loads_no_engine_and_no_other_process_code(module: str) -> None:
    loaded = loaded_after(module)
    assert module in loaded
    assert not other_processes_code(loaded), (
        f"{module} loads {sorted(other_processes_code(loaded))}"
    )


def test_the_in_router_classifier_is_the_one_that_loads_the_engine() -> None:
    """The allowed crossing at run time: the classifier's module loads nothing heavy until used;
    the check on a chat replica's module finds the engine (the check can fail)."""
    assert not other_processes_code(loaded_after("deployments.ingress.security.gate_classifier"))
    loaded = loaded_after("deployments.replica.chat")
    assert {"onnxruntime", "deployments.replica.engine.llm"} <= loaded
