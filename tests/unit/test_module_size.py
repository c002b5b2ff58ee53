"""No module over 400 lines in our packages (deployments, edge_sim, edgectl, benchmarks; tests
are out of the rule): one that grows past it holds more than one job and is split by job."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("deployments", "edge_sim", "edgectl", "benchmarks")
MAX_LINES = 400


def oversized(root: Path, exceptions: frozenset[str] = frozenset()) -> dict[str, int]:
    """Every module over MAX_LINES under `root`'s packages, by path, with its line count."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            name = path.relative_to(root).as_posix()
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > MAX_LINES and name not in exceptions:
                found[name] = lines
    return found


def test_no_module_is_over_400_lines():
    found = oversized(REPO)
    assert not found, f"modules over {MAX_LINES} lines (split them by job): {found}"


def test_a_module_over_the_limit_is_found_and_one_at_it_is_not(tmp_path: Path):
    for name, lines in {
        "edgectl/big.py": MAX_LINES + 1,
        "benchmarks/suite/at_limit.py": MAX_LINES,
        "deployments/export/llm.py": MAX_LINES + 50,
        "tests/unit/test_huge.py": MAX_LINES * 3,
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n" * lines)
    assert oversized(tmp_path) == {
        "deployments/export/llm.py": MAX_LINES + 50,
        "edgectl/big.py": MAX_LINES + 1,
    }
    assert oversized(tmp_path, frozenset({"deployments/export/llm.py"})) == {
        "edgectl/big.py": MAX_LINES + 1
    }
