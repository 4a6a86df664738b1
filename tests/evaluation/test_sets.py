"""Evaluation sets: bundled names, paths, multi-turn, bad input."""

from __future__ import annotations

import pytest
from draftsmith.errors import DataError
from draftsmith.evaluation.sets import KNOWN_SETS, load_set


def test_bundled_sets_load():
    for name in KNOWN_SETS:
        s = load_set(name)
        assert s.name == name and len(s.prompts) == 80
    mt = load_set("mt_bench", limit=3)
    assert len(mt.prompts) == 3
    assert all(len(p.turns) == 2 for p in mt.prompts)  # MT-bench is two-turn
    assert mt.prompts[0].id == "81" and mt.prompts[0].category == "writing"


def test_path_in_eagle_layout(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text('{"question_id": 7, "turns": ["Hi?"]}\n\n{"turns": ["a", "b"]}\n')
    s = load_set(str(f))
    assert s.name == "mine"
    assert [p.turns for p in s.prompts] == [("Hi?",), ("a", "b")]
    assert [p.id for p in s.prompts] == ["7", "3"]


def test_unknown_name_lists_known_ones():
    with pytest.raises(DataError) as e:
        load_set("mtbench")
    for name in KNOWN_SETS:
        assert name in str(e.value)


def test_bad_lines_are_refused(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"question": "no turns"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:1 has no 'turns'"):
        load_set(str(f))
    f.write_text("{not json\n")
    with pytest.raises(DataError, match="not valid JSON"):
        load_set(str(f))


def test_bundled_sets_ship_in_a_normal_install(tmp_path):
    """A non-editable install (what the project image does: `pip install .`) carries the sets as package data."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    src = tmp_path / "src"
    shutil.copytree(repo / "shared" / "draftsmith", src / "shared" / "draftsmith",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(repo / name, src / name)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(src)], check=True, capture_output=True, timeout=300)
    shutil.rmtree(src)  # nothing of the source tree is left to find the sets in
    code = ("import draftsmith.evaluation.sets as m; from draftsmith.evaluation.sets import load_set;"
            "print(m.__file__); print(*(len(load_set(n).prompts) for n in m.KNOWN_SETS))")
    p = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    where, counts = p.stdout.splitlines()
    assert where.startswith(str(site))
    assert counts == "80 80 80 80"
