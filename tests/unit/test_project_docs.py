"""The README is the front door and docs/ (with benchmarks/README.md) holds the depth: the README
stays small, every relative link in them reaches a file (and a heading, when it names one), the
commands they give exist, and they tell the project as it is, not the history of its work: the
performance pages are a reference table, not a run diary."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

from edgectl.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
BENCHMARKS = REPO / "benchmarks" / "README.md"
PAGES = [README, *DOCS, BENCHMARKS]
# The figures' pages: one current table and how to reproduce it; a run's story lives in git.
RESULTS_PAGES = [REPO / "docs" / "performance.md", BENCHMARKS]
README_MAX_BYTES = 12 * 1024
# [text](target) and ![alt](target); a target ends at whitespace or the closing parenthesis.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.M)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
# A dated run log's words: a time of day, "tried / not kept", a heading that names a date.
DIARY = re.compile(
    r"\b(?:in the |late |early )?(?:morning|afternoon|evening|midday|night)\b"
    r"|\btried\b|\bnot kept\b|^#{1,6} .*\b\d{4}-\d{2}-\d{2}\b",
    re.I | re.M,
)


def _page_id(page: Path) -> str:
    return str(page.relative_to(REPO))


def _prose(page: Path) -> str:
    """The page without its code blocks (a `#` comment in a shell block is no heading)."""
    return FENCE.sub("", page.read_text(encoding="utf-8"))


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in ("L", "N"))
    return kept.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_anchor(title) for _level, title in HEADING.findall(_prose(page))}


def _relative_links(page: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(_prose(page))
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto:
    ]


def test_the_readme_is_a_front_door_not_a_manual() -> None:
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes: move depth to docs/"
    for section in ("## The two commands", "## Using it", "## Layout"):
        assert section in README.read_text(encoding="utf-8")


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {
        (README.parent / target.split("#")[0]).resolve() for target in _relative_links(README)
    }
    assert [_page_id(page) for page in DOCS if page.resolve() not in linked] == []


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in _relative_links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {resolved.name}")
    assert broken == []


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_the_make_targets_and_edge_commands_given_exist(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, re.M))
    assert {"serve", "test"} <= targets
    named = set(re.findall(r"`(?:[A-Z_]+=\S+ )*make ([a-z][a-z-]*)", text))
    named |= set(re.findall(r"^(?:[A-Z_]+=\S+ )*make ([a-z][a-z-]*)", text, re.M))
    assert sorted(named - targets) == []
    # argparse lists a parser's subcommands only through its private attributes.
    subcommands = set(build_parser()._subparsers._group_actions[0].choices)
    given = set(re.findall(r"(?:\.venv/bin/|`)edge ([a-z][a-z0-9-]*)", text))
    assert sorted(given - subcommands) == []


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_the_docs_tell_the_project_not_the_history_of_its_work(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    history = re.findall(
        r"\bwaves?\b|\bissues? #?\d+|#\d{1,4}\b(?!-)|\b(?:previous|this|last|per-)\s*stop\b",
        text,
        re.I,
    )
    assert history == []


@pytest.mark.parametrize("page", RESULTS_PAGES, ids=_page_id)
def test_the_results_pages_are_a_reference_not_a_run_diary(page: Path) -> None:
    assert DIARY.findall(page.read_text(encoding="utf-8")) == []


def test_the_diary_check_catches_a_dated_run_log() -> None:
    for diary in (
        "### Late evening 2026-12-04: the idle floor",
        "Tried and not kept: Serve's metrics export every 1 s",
        "1.561x in the afternoon",
        "## Quiet machine, 2026-12-03",
    ):
        assert DIARY.findall(diary), diary
    assert DIARY.findall("| Kimi TTFT vs vLLM | <= 1.0x | 0.886x | B | 2026-12-04 |") == []
