"""The package is self-contained: its docstrings cite files of this repository or public sources, never notes that
live outside the repository."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "shared" / "draftsmith"


def test_no_reference_to_notes_outside_the_repository():
    outside = ("../shared/", "shared/notes", "eagle3.md", "failure-modes.md", "embedded-target.md")
    hits = [f"{p.relative_to(PACKAGE)}:{n}: {line.strip()[:80]}"
            for p in sorted(PACKAGE.rglob("*.py")) for n, line in enumerate(p.read_text().splitlines(), 1)
            if any(o in line for o in outside)]
    assert not hits, "docstrings point outside the repository:\n" + "\n".join(hits)


def test_cited_repository_docs_exist():
    import re

    cited = {m for p in PACKAGE.rglob("*.py") for m in re.findall(r"docs/[a-z0-9_-]+\.md", p.read_text())}
    assert cited, "no docs/ citation found: the scan is broken"
    missing = sorted(c for c in cited if not (PACKAGE.parents[1] / c).is_file())
    assert not missing, f"docstrings cite docs that do not exist: {missing}"


def test_the_package_finds_no_data_by_counting_parent_folders():
    """Run-time data is package data (eval sets, the DeepSeek template) or an explicit setting (``prompts_dir``);
    a path built from ``__file__``'s parents breaks in any install that is not this checkout."""
    import re

    pat = re.compile(r"__file__\)\.resolve\(\)\.parents\[|\.parent\.parent")
    offenders = [p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if pat.search(p.read_text())]
    assert offenders == [], offenders


def test_code_comments_say_why_not_which_ticket():
    """Comments and docstrings say why, never when: a ticket number ("issue" followed by a number) means nothing
    to a reader of the code. Scans the package, the tests, the benchmarks, the scripts and the services."""
    import re

    root = PACKAGE.parents[1]
    pat = re.compile(r"\b" + "iss" + r"ue #?\d+", re.IGNORECASE)
    files = [p for d in ("shared", "tests", "bench", "scripts", "services") for p in (root / d).rglob("*")
             if p.suffix in (".py", ".sh", ".md") and p.is_file()]
    assert len(files) > 100, "the scan found too few files: it is broken"
    hits = [f"{p.relative_to(root)}:{n}" for p in files for n, line in enumerate(p.read_text().splitlines(), 1)
            if pat.search(line)]
    assert not hits, hits
