"""Each hand-off between stages has one owner: the schema tags and the hand-off file names of the
package are spelled in :mod:`draftsmith.artifacts` only.

The check reads the package source (``shared/draftsmith/**/*.py``). Schema tags are searched as quoted literals
anywhere in a file; file names as string constants outside docstrings (error messages that name a file build it
from the owner's constant), so prose may still mention them.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "shared" / "draftsmith"
SCHEMA_TAGS = ("draftsmith.record/1", "draftsmith.data/1", "draftsmith.features/1", "draftsmith.vocab/1",
               "draftsmith.checkpoint/1", "draftsmith.eval-report/1")
FILE_NAMES = ("manifest.json", "stats.json", "latest.json", ".meta.json", "model.safetensors", "report.json",
              "report.md", "report.png", "metrics.prom", "optimizer.pt", "scheduler.pt", "rng.pt", "demo.json",
              "demo-config.yaml")
# a name as a path component: "stats.json" but not "data-stats.json"; ".meta.json" is a suffix, matched anywhere
NAME_RE = {n: re.compile(("" if n.startswith(".") else r"(?<![\w.-])") + re.escape(n)) for n in FILE_NAMES}


def _modules(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _owned(path: Path, root: Path) -> bool:
    rel = path.relative_to(root).as_posix()
    return rel.startswith("artifacts/")


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                ids.add(id(first.value))
    return ids


def _prose_nodes(tree: ast.AST) -> set[int]:
    """Ids of the string constants given as ``description=`` or ``help=`` (a setting's or a flag's prose)."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg in ("description", "help"):
            ids.update(id(n) for n in ast.walk(node.value) if isinstance(n, ast.Constant))
    return ids


def code_strings(source: str) -> list[str]:
    """String constants of a module's code (f-string parts included), docstrings and setting/flag help left out."""
    tree = ast.parse(source)
    docs = _docstring_nodes(tree) | _prose_nodes(tree)
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def schema_tag_homes(root: Path) -> dict[str, list[str]]:
    """``{tag: [modules spelling it as a quoted literal]}`` under ``root``."""
    out: dict[str, list[str]] = {t: [] for t in SCHEMA_TAGS}
    for p in _modules(root):
        text = p.read_text(encoding="utf-8")
        for t in SCHEMA_TAGS:
            if f'"{t}"' in text or f"'{t}'" in text:
                out[t].append(p.relative_to(root).as_posix())
    return out


def file_name_spellers(root: Path) -> dict[str, list[str]]:
    """``{file name: [modules outside artifacts/ and paths.py spelling it in code]}`` under ``root``."""
    out: dict[str, list[str]] = {n: [] for n in FILE_NAMES}
    for p in _modules(root):
        rel = p.relative_to(root).as_posix()
        if _owned(p, root) or rel == "paths.py":
            continue
        strings = code_strings(p.read_text(encoding="utf-8"))
        for n in FILE_NAMES:
            if any(NAME_RE[n].search(s) for s in strings):
                out[n].append(rel)
    return out


@pytest.mark.parametrize("tag", SCHEMA_TAGS)
def test_schema_tag_has_one_owner(tag):
    homes = schema_tag_homes(PACKAGE)[tag]
    assert len(homes) == 1 and homes[0].startswith("artifacts/"), (
        f"{tag} is spelled in {homes}; it belongs to one module of draftsmith/artifacts/")


@pytest.mark.parametrize("name", FILE_NAMES)
def test_file_name_spelled_by_artifacts_only(name):
    spellers = file_name_spellers(PACKAGE)[name]
    assert not spellers, f"{name} is built by hand in {spellers}; use draftsmith.artifacts (or RunPaths)"


def test_the_checks_catch_a_hand_built_path(tmp_path):
    """The scanners see what they are meant to: a tag outside artifacts/, a path built by hand in code, and not
    a docstring that merely names the file."""
    (tmp_path / "artifacts").mkdir()
    (tmp_path / "artifacts" / "data.py").write_text('DATA_SCHEMA = "draftsmith.data/1"\n')
    (tmp_path / "stage.py").write_text(
        '"""Reads manifest.json."""\nSCHEMA = "draftsmith.data/1"\n\n'
        'def f(d):\n    """The stats.json of d."""\n    return d / "manifest.json", f"{d}/x.meta.json"\n')
    assert schema_tag_homes(tmp_path)["draftsmith.data/1"] == ["artifacts/data.py", "stage.py"]
    spellers = file_name_spellers(tmp_path)
    assert spellers["manifest.json"] == ["stage.py"] and spellers[".meta.json"] == ["stage.py"]
    assert spellers["stats.json"] == [] and spellers["latest.json"] == []


def test_export_file_names_are_hugging_faces():
    """The export owner spells HF's names to stay import-light; they must still be transformers' own."""
    from draftsmith.artifacts import export
    from transformers.utils import CONFIG_NAME, SAFE_WEIGHTS_NAME

    assert (export.CONFIG_FILE, export.WEIGHTS_FILE) == (CONFIG_NAME, SAFE_WEIGHTS_NAME)


def test_the_export_layout_is_read_from_its_config():
    from draftsmith.artifacts.export import layout_dir, layout_of

    assert layout_of({"speculators_model_type": "eagle3"}) == "speculators"
    assert layout_of({"architectures": ["LlamaForCausalLMEagle3"]}) == "eagle3"
    assert layout_of({"eagle_config": {}}) == "eagle3"
    assert layout_of({"architectures": ["LlamaForCausalLM"]}) is None
    with pytest.raises(ValueError, match="unknown export layout"):
        layout_dir(Path("export"), "medusa")


def test_a_report_of_another_schema_is_refused(tmp_path):
    from draftsmith.artifacts.report import read_report

    assert read_report(tmp_path) is None
    (tmp_path / "report.json").write_text('{"schema": "draftsmith.eval-report/0"}')
    with pytest.raises(ValueError, match="eval-report/0"):
        read_report(tmp_path)


def test_the_target_config_has_one_reader():
    """The target's ``config.json`` is found and read by :mod:`draftsmith.target.checkpoint` only
    (``read_target_config``, ``target_config_path``); the export owner spells the same Hugging Face name for the
    drafter's own config."""
    spellers = []
    for p in _modules(PACKAGE):
        rel = p.relative_to(PACKAGE).as_posix()
        if _owned(p, PACKAGE) or rel == "target/checkpoint.py":
            continue
        if any(re.search(r"(?<![\w.-])config\.json", s) for s in code_strings(p.read_text(encoding="utf-8"))):
            spellers.append(rel)
    assert spellers == [], f"config.json is built by hand in {spellers}; use draftsmith.target.checkpoint"
