"""The raw output behind the docs' GPU claims (docs/results) against the docs that cite it.

Every path under ``docs/results/`` that a document names (Markdown in docs/ and the README, the CI scripts) exists,
so a figure never points at a file that was deleted when it was superseded; docs/results keeps to one folder per
dated run and at most 100 files; docs/BENCHMARKS.md stays a status document (<= 300 lines).  Paths written with a
brace list or a wildcard name their run folder only, and that folder must exist.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "results"
RUN_FOLDER = re.compile(r"^20\d\d-\d\d-\d\d-[a-z0-9]+-[A-Za-z0-9_-]+$")
CITED = re.compile(r"(20\d\d-\d\d-\d\d-(?:h200|h100|devbox)-[A-Za-z0-9_-]+)(/[A-Za-z0-9_./{},*-]*)?")


def _citing_files() -> list[Path]:
    docs = [p for p in (REPO / "docs").rglob("*.md") if RESULTS not in p.parents]
    return sorted([REPO / "README.md", *docs, *(REPO / "ci").glob("*.sh")])


def _citations() -> list[tuple[str, str, str | None]]:
    found = []
    for path in _citing_files():
        for match in CITED.finditer(path.read_text()):
            rest = (match.group(2) or "").rstrip(".,/")
            found.append((str(path.relative_to(REPO)), match.group(1), rest or None))
    return found


@pytest.mark.skipif(not RESULTS.is_dir(), reason="no docs/results in this tree")
def test_every_cited_raw_file_exists():
    missing = []
    for source, folder, rest in _citations():
        if not (RESULTS / folder).is_dir():
            missing.append(f"{source}: {folder}")
        elif rest and not any(mark in rest for mark in "{*") and not (RESULTS / folder / rest.lstrip("/")).exists():
            missing.append(f"{source}: {folder}{rest}")
    assert not missing, "docs cite raw output that is not in docs/results:\n" + "\n".join(sorted(set(missing)))


@pytest.mark.skipif(not RESULTS.is_dir(), reason="no docs/results in this tree")
def test_results_are_run_folders_and_few():
    loose = [p.name for p in RESULTS.iterdir() if p.is_file() or not RUN_FOLDER.match(p.name)]
    assert not loose, f"docs/results holds only dated run folders: {loose}"
    files = [p for p in RESULTS.rglob("*") if p.is_file()]
    assert len(files) <= 100, f"docs/results has {len(files)} files (at most 100: keep the raw files of today's claims)"


def test_benchmarks_is_a_status_document():
    lines = (REPO / "docs" / "BENCHMARKS.md").read_text().splitlines()
    assert len(lines) <= 300
    assert any(line.startswith("## Status") for line in lines)
