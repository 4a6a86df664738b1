"""Evaluation prompt sets in the EAGLE layout: one JSON object per line with a ``turns`` list of user messages.

Bundled sets (80 questions each, package data under ``draftsmith/evaluation/data/``, so that a normal
non-editable install such as the project's image has them; ``data/eval`` in the repository links there): ``mt_bench`` (two turns per question), ``gsm8k``,
``humaneval``, ``alpaca``; the layout is the one EAGLE's ``gen_ea_answer_*`` scripts and SpecForge's benchmarks
read. Any JSONL file in that layout can be passed by path instead of a name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from draftsmith.errors import DataError

KNOWN_SETS = ("mt_bench", "gsm8k", "humaneval", "alpaca")


@dataclass(frozen=True)
class EvalPrompt:
    """One evaluation question: its id and the user turns, answered in order (multi-turn for MT-bench)."""

    id: str
    turns: tuple[str, ...]
    category: str | None = None


@dataclass(frozen=True)
class EvalSet:
    """A named list of prompts (``name`` is the bundled name or the file stem)."""

    name: str
    path: Path
    prompts: tuple[EvalPrompt, ...]


def bundled_dir() -> Path:
    """Folder of the bundled sets: the package data ``draftsmith/evaluation/data`` of the installed package."""
    return Path(str(files("draftsmith.evaluation") / "data"))


def resolve_set_path(spec: str, sets_dir: Path | None = None) -> tuple[str, Path]:
    """Map a set name or a path to ``(name, file)``.

    Raises:
        DataError: ``spec`` is neither a bundled set name nor an existing file; the message lists the known names.
    """
    folder = Path(sets_dir) if sets_dir else bundled_dir()
    if spec in KNOWN_SETS:
        path = folder / f"{spec}.jsonl"
        if not path.is_file():
            raise DataError(f"bundled eval set {spec!r} is missing at {path}", "set eval.sets_dir to the folder")
        return spec, path
    path = Path(spec).expanduser()
    if path.is_file():
        return path.stem, path
    raise DataError(
        f"unknown eval set {spec!r}",
        f"use one of {', '.join(KNOWN_SETS)} or the path of a JSONL file in the EAGLE layout (a 'turns' list)",
    )


def load_set(spec: str, limit: int | None = None, sets_dir: Path | None = None) -> EvalSet:
    """Read an evaluation set.

    Args:
        spec: a bundled name (``mt_bench``...) or a path to a JSONL file with a ``turns`` list of strings per line.
        limit: keep the first ``limit`` questions (None = all).
        sets_dir: folder of the bundled sets (None = the package's own, :func:`bundled_dir`).

    Returns:
        The :class:`EvalSet`.

    Raises:
        DataError: unknown name, unreadable file, a line without a non-empty ``turns`` list of strings, or no prompt.
    """
    name, path = resolve_set_path(spec, sets_dir)
    prompts: list[EvalPrompt] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno} is not valid JSON ({e.msg})", "fix or remove that line") from e
            turns = row.get("turns") if isinstance(row, dict) else None
            if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
                raise DataError(
                    f"{path}:{lineno} has no 'turns' list of non-empty strings",
                    "use the EAGLE layout: {\"question_id\": 1, \"turns\": [\"first user message\", ...]}",
                )
            qid = row.get("question_id", row.get("id", lineno))
            prompts.append(EvalPrompt(id=str(qid), turns=tuple(turns), category=row.get("category")))
            if limit is not None and len(prompts) >= limit:
                break
    if not prompts:
        raise DataError(f"eval set {path} holds no prompt", "pass a file with at least one line")
    return EvalSet(name=name, path=path, prompts=tuple(prompts))
