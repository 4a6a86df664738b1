"""Drafter versions of a run: every export tried on a canary is kept as ``drafters/v<N>/`` with its provenance, and
``drafters/serving.json`` names the version on the stable route.

Layout (``docs/serving.md``, section "Canary, promote, roll back")::

    runs/<run>/drafters/v1/                  a copy of the export folder vLLM loads (config.json + *.safetensors)
    runs/<run>/drafters/v1/provenance.json   which export, checkpoint and data made it, and when
    runs/<run>/drafters/serving.json         {"version": "v2", "previous": "v1", "since": ..., "url": ...}
    runs/<run>/drafters/decisions.jsonl      one line per canary decision, with its numbers

A version is never changed once written (copied to a hidden folder, then renamed into place), so the folder an
engine loaded stays what it loaded; ``serving.json`` is replaced atomically. Local run folders only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftsmith.artifacts.export import config_path
from draftsmith.errors import ModelError
from draftsmith.paths import RunPaths

VERSIONS_DIR = "drafters"
PROVENANCE = "provenance.json"
SERVING = "serving.json"
DECISIONS = "decisions.jsonl"
PROVENANCE_SCHEMA = "draftsmith.drafter-version/1"
_NAME = re.compile(r"^v(\d+)$")


@dataclass(frozen=True)
class Version:
    """One drafter version: its name (``v<N>``), its folder and its provenance record."""

    name: str
    path: Path
    provenance: dict[str, Any]

    @property
    def number(self) -> int:
        """N of ``v<N>``."""
        return version_number(self.name)


def version_number(name: str) -> int:
    """N of a version name ``v<N>``.

    Raises:
        ModelError: ``name`` is not of the form ``v<N>``.
    """
    m = _NAME.match(name)
    if not m:
        raise ModelError(f"{name!r} is not a drafter version name", "use v1, v2, ... (`draftsmith canary --list`)")
    return int(m.group(1))


def versions_dir(run_root: Path) -> Path:
    """``runs/<run>/drafters``."""
    return Path(run_root) / VERSIONS_DIR


def list_versions(run_root: Path) -> list[Version]:
    """The run's versions, oldest first (by N)."""
    root = versions_dir(run_root)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        if p.is_dir() and _NAME.match(p.name):
            prov = p / PROVENANCE
            out.append(Version(p.name, p, json.loads(prov.read_text()) if prov.is_file() else {}))
    return sorted(out, key=lambda v: v.number)


def get_version(run_root: Path, name: str) -> Version:
    """The version ``name`` of the run.

    Raises:
        ModelError: no such version (the message lists the run's versions).
    """
    version_number(name)
    for v in list_versions(run_root):
        if v.name == name:
            return v
    known = ", ".join(v.name for v in list_versions(run_root)) or "none"
    raise ModelError(f"the run has no drafter version {name} (versions: {known})",
                     "pass an export folder to make a new version, or one of the versions listed")


def _file_digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def provenance_of(paths: RunPaths, export_dir: Path, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Where an export came from: the export folder, the latest checkpoint record and the digests of the data and
    records manifests (the data that made it) of the run that exported it (the one whose ``export/`` holds it, else
    ``paths``' run), the build that exported it."""
    export_dir = Path(export_dir).resolve()
    if export_dir.parent.name == paths.export.name:  # <runs>/<run>/export/<layout>: made by that run
        run_root = export_dir.parents[1]
        paths = RunPaths(run_root.parent, run_root.name)
    latest = paths.checkpoints_latest
    cfg = config_path(Path(export_dir))
    code = json.loads(cfg.read_text()).get("code_version") if cfg.is_file() else None
    return {
        "schema": PROVENANCE_SCHEMA,
        "export": str(export_dir),
        "run": str(paths.root),
        "checkpoint": json.loads(latest.read_text()) if latest.is_file() else None,
        "data_manifest_sha256": _file_digest(paths.data_manifest),
        "records_manifest_sha256": _file_digest(paths.records_manifest),
        "code_version": code,
        **(extra or {}),
    }


def add_version(paths: RunPaths, export_dir: Path, extra: dict[str, Any] | None = None) -> Version:
    """Copy ``export_dir`` into the next version folder of the run and record its provenance.

    Args:
        paths: the run's folders.
        export_dir: an exported drafter folder (``config.json`` + ``*.safetensors``).
        extra: more provenance fields (e.g. the command that made it).

    Returns:
        The new :class:`Version`.

    Raises:
        ModelError: ``export_dir`` is not a folder with a ``config.json``.
    """
    export_dir = Path(export_dir)
    if not config_path(export_dir).is_file():
        raise ModelError(f"{export_dir} is not an exported drafter (no {config_path(export_dir).name})",
                         "pass the run's export/eagle3 (`draftsmith export`) or another drafter folder")
    root = versions_dir(paths.root)
    root.mkdir(parents=True, exist_ok=True)
    prov = provenance_of(paths, export_dir, extra)
    while True:
        n = max((v.number for v in list_versions(paths.root)), default=0) + 1
        tmp = root / f".v{n}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(export_dir, tmp)
        record = {**prov, "version": f"v{n}", "created": time.time()}
        (tmp / PROVENANCE).write_text(json.dumps(record, indent=2) + "\n")
        try:
            os.rename(tmp, root / f"v{n}")  # fails when another writer took v<n> meanwhile: take the next
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            continue
        return Version(f"v{n}", root / f"v{n}", record)


def read_serving(run_root: Path) -> dict[str, Any] | None:
    """``drafters/serving.json`` (the version on the stable route), or None when none was recorded."""
    p = versions_dir(run_root) / SERVING
    return json.loads(p.read_text()) if p.is_file() else None


def write_serving(run_root: Path, version: str, url: str | None = None) -> dict[str, Any]:
    """Record ``version`` as the serving one (atomically: write a temporary file, then rename); returns it."""
    root = versions_dir(run_root)
    root.mkdir(parents=True, exist_ok=True)
    before = read_serving(run_root)
    doc = {"version": version, "previous": before["version"] if before else None, "since": time.time(), "url": url}
    tmp = root / f".{SERVING}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(doc) + "\n")
    os.replace(tmp, root / SERVING)
    return doc


def append_decision(run_root: Path, decision: dict[str, Any]) -> Path:
    """Append one decision (a JSON object per line) to ``drafters/decisions.jsonl``; returns the file."""
    p = versions_dir(run_root) / DECISIONS
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a") as f:
        f.write(json.dumps(decision) + "\n")
    return p


def read_decisions(run_root: Path) -> list[dict[str, Any]]:
    """Every decision of the run, oldest first."""
    p = versions_dir(run_root) / DECISIONS
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.is_file() else []
