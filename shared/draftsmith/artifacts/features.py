"""Target features under ``runs/<run>/features/`` (docs/formats.md §4): names, schema tags, manifest.

Layout: ``features-NNNNN.safetensors`` shards (``aux_hidden [T_total, 3*H]``, ``final_hidden [T_total, H]``
post-norm, ``offsets`` int64 ``[S+1]``), each with its sidecar ``features-NNNNN.json`` (schema
:data:`SHARD_SCHEMA`), and ``manifest.json`` (schema :data:`FEATURES_SCHEMA`) rebuilt from the sidecars.
Writer: :mod:`draftsmith.features.store`; reader: :mod:`draftsmith.drafter.data` (offline training).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from draftsmith.artifacts.location import run_location
from draftsmith.errors import DataError

FEATURES_SCHEMA = "draftsmith.features/1"
SHARD_SCHEMA = "draftsmith.feature-shard/1"
MANIFEST_FILE = "manifest.json"
LOCK_FILE = ".lock"


def shard_file(index: int) -> str:
    """File name of feature shard ``index`` (= data shard index): ``features-NNNNN.safetensors``."""
    return f"features-{index:05d}.safetensors"


def sidecar_file(index: int) -> str:
    """File name of the sidecar of feature shard ``index``: ``features-NNNNN.json``."""
    return f"features-{index:05d}.json"


def manifest_path(features_dir: Path) -> Path:
    """``features/manifest.json``."""
    return run_location(features_dir) / MANIFEST_FILE


def write_manifest(features_dir: Path, manifest: dict[str, Any]) -> None:
    """Replace ``features/manifest.json`` atomically (indent 1)."""
    from draftsmith.artifacts.provenance import stamp
    from draftsmith.artifacts.storage import atomic_write_text

    atomic_write_text(manifest_path(features_dir), json.dumps(stamp(manifest), indent=1))


def load_manifest(features_dir: Path) -> dict[str, Any] | None:
    """The manifest as stored, unvalidated (to compare a resumed extraction with), None when there is none.

    Raises:
        ValueError: the file is not JSON.
    """
    f = manifest_path(features_dir)
    return json.loads(f.read_text()) if f.is_file() else None


def read_manifest(features_dir: Path) -> dict[str, Any]:
    """The features manifest, checked for training: schema :data:`FEATURES_SCHEMA`, a post-norm final hidden state.

    Keys used by readers: ``hidden_size``, ``layer_ids``, ``target_model``, ``final_hidden`` and ``shards``
    (``file``, ``sample_ids``, ``lengths``, ``sha256``, ``skipped``: ``[{"id", "reason"}]``).

    Raises:
        DataError: missing, of another schema, or storing a pre-norm final hidden state.
    """
    f = manifest_path(features_dir)
    if not f.is_file():
        raise DataError(f"no features manifest at {f}", f"run the stage that writes {f.parent.name}/ first")
    m = json.loads(f.read_text())
    if m.get("schema") != FEATURES_SCHEMA:
        raise DataError(f"{f} has schema {m.get('schema')!r}, expected {FEATURES_SCHEMA!r}",
                        "rebuild it with this version")
    if m.get("final_hidden", "post_norm") != "post_norm":
        raise DataError("features store a pre-norm final hidden state", "re-extract with final_hidden=post_norm")
    return m


def manifest_from_sidecars(header: dict[str, Any], sides: list[dict[str, Any]]) -> dict[str, Any]:
    """A features manifest: the run-level fields of ``header`` plus ``shards``, ``samples``, ``tokens`` and
    ``skipped_samples`` from the shard sidecars ``sides`` (in shard order)."""
    keep = ("file", "data_shard", "sample_ids", "lengths", "sha256", "skipped")
    m = {k: v for k, v in header.items() if k not in ("shards", "samples", "tokens", "skipped_samples",
                                                      "code_version")}
    m["shards"] = [{k: s[k] for k in keep if k in s} for s in sides]
    m["samples"] = sum(len(s["sample_ids"]) for s in sides)
    m["tokens"] = sum(s["tokens"] for s in sides)
    m["skipped_samples"] = sum(len(s.get("skipped", [])) for s in sides)
    return m


def rebuild_from_sidecars(features_dir: Path) -> dict[str, Any] | None:
    """Rewrite ``features/manifest.json`` of a local folder from its complete shards (sidecar and file both there)
    and the shards it already lists whose file is there, keeping its run-level fields; None (nothing written) when
    the folder has no manifest.

    A working copy pulled from an object store calls it: the store's manifest may have been written while another
    host was still finishing a shard, the sidecars never miss one.
    """
    header = load_manifest(features_dir)
    if header is None:
        return None
    d = Path(features_dir)
    # the manifest's own entries, then every sidecar's (a sidecar wins): no shard the manifest lists is dropped
    shards = {e["file"]: {**e, "tokens": sum(e["lengths"])} for e in header.get("shards", [])
              if (d / e["file"]).is_file()}
    for side in sorted(d.glob("features-*.json")):
        s = json.loads(side.read_text())
        if (d / s["file"]).is_file():
            shards[s["file"]] = s
    m = manifest_from_sidecars(header, [shards[k] for k in sorted(shards)])  # file names sort as shard indices
    write_manifest(d, m)
    return m
