"""The evaluation report under ``runs/<run>/eval/`` (docs/formats.md §7): file names, schema tag, reader.

``report.json`` (schema :data:`REPORT_SCHEMA`, for machines), ``report.md`` (for a person), ``report.png`` (engines
side by side) and ``metrics.prom`` (the same gauges as a node-exporter textfile). Writer:
:mod:`draftsmith.evaluation.report`; readers: the demo's closing report and ``bench/recipe.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from draftsmith.artifacts.location import run_location

REPORT_SCHEMA = "draftsmith.eval-report/1"
JSON_FILE = "report.json"
MARKDOWN_FILE = "report.md"
PNG_FILE = "report.png"
PROM_FILE = "metrics.prom"


def report_paths(eval_dir: Path) -> dict[str, Path]:
    """``{"json", "md", "png", "prom"}`` -> the report's files in ``eval_dir``."""
    d = run_location(eval_dir)
    return {"json": d / JSON_FILE, "md": d / MARKDOWN_FILE, "png": d / PNG_FILE, "prom": d / PROM_FILE}


def read_report(eval_dir: Path) -> dict[str, Any] | None:
    """The ``report.json`` in ``eval_dir``, or None when there is none yet.

    Raises:
        ValueError: the file is not JSON, or its ``schema`` is not :data:`REPORT_SCHEMA`.
    """
    f = report_paths(eval_dir)["json"]
    if not f.is_file():
        return None
    rep = json.loads(f.read_text())
    if rep.get("schema") != REPORT_SCHEMA:
        raise ValueError(f"{f} has schema {rep.get('schema')!r}, expected {REPORT_SCHEMA!r}")
    return rep
