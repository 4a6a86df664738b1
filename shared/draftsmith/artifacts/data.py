"""Training samples under ``runs/<run>/data/`` (docs/formats.md §3): names, schema tag, manifest and stats.

Layout: ``samples-XXXXX.safetensors`` shards (``input_ids`` int32 ``[T_total]``, ``loss_mask`` uint8
``[T_total]``, ``offsets`` int64 ``[S+1]``), ``manifest.json`` (schema :data:`DATA_SCHEMA`, written last: it marks
a complete build), ``stats.json`` (written by every build, failed ones included) and ``vocab/``
(:mod:`draftsmith.artifacts.vocab`). Writer: :mod:`draftsmith.data.build`; readers: the extractor
(:mod:`draftsmith.features.plan`) and the trainer (:mod:`draftsmith.drafter.data`), both through
:func:`read_manifest` and :func:`read_shard`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from draftsmith.artifacts.location import run_location
from draftsmith.artifacts.provenance import stamp
from draftsmith.artifacts.storage import atomic_write_text
from draftsmith.errors import DataError

DATA_SCHEMA = "draftsmith.data/1"
STATS_SCHEMA = "draftsmith.data-stats/1"

MANIFEST_FILE = "manifest.json"
STATS_FILE = "stats.json"
VOCAB_DIR = "vocab"
SHARD_GLOB = "samples-*.safetensors"


class ShardEntry(TypedDict):
    """One shard of the manifest: ``file`` name, ``sample_ids`` and ``lengths`` (tokens) in shard order, ``sha256``
    of the file."""

    file: str
    sample_ids: list[str]
    lengths: list[int]
    sha256: str


class DataManifest(TypedDict, total=False):
    """``data/manifest.json``: ``schema``, ``tokenizer`` (``path``, ``sha256``), ``target_model``,
    ``target_vocab_size``, ``max_length``, ``data_hash``, ``shards`` and the resolved ``config``."""

    schema: str
    tokenizer: dict[str, str]
    target_model: str | None
    target_vocab_size: int
    max_length: int
    data_hash: str
    shards: list[ShardEntry]
    config: dict[str, Any]


def shard_file(index: int) -> str:
    """File name of data shard ``index``: ``samples-XXXXX.safetensors``."""
    return f"samples-{index:05d}.safetensors"


def manifest_path(data_dir: Path) -> Path:
    """``data/manifest.json``."""
    return run_location(data_dir) / MANIFEST_FILE


def stats_path(data_dir: Path) -> Path:
    """``data/stats.json``."""
    return run_location(data_dir) / STATS_FILE


def vocab_dir(data_dir: Path) -> Path:
    """``data/vocab/``."""
    return run_location(data_dir) / VOCAB_DIR


def output_files(data_dir: Path) -> list[Path]:
    """What marks a build as done and must go before a new build starts: the shards and the manifest."""
    data_dir = run_location(data_dir)
    return list(data_dir.glob(SHARD_GLOB)) + [manifest_path(data_dir)]


def write_manifest(data_dir: Path, manifest: DataManifest) -> None:
    """Replace ``data/manifest.json`` atomically (indent 2, trailing newline); write it last."""
    atomic_write_text(manifest_path(data_dir), json.dumps(stamp(dict(manifest)), indent=2) + "\n")


def write_stats(data_dir: Path, stats: dict[str, Any]) -> None:
    """Replace ``data/stats.json`` atomically (indent 2, trailing newline)."""
    atomic_write_text(stats_path(data_dir), json.dumps(stats, indent=2) + "\n")


def validate_manifest(m: Any, where: Path) -> DataManifest:
    """Check a parsed data manifest: a JSON object of schema :data:`DATA_SCHEMA` listing at least one shard.

    Raises:
        DataError: another schema, or no shard (the message names ``where``).
    """
    schema = m.get("schema") if isinstance(m, dict) else None
    if schema != DATA_SCHEMA:
        raise DataError(f"the data manifest {where} has schema {schema!r}, expected {DATA_SCHEMA!r}",
                        "rebuild the data with this version of draftsmith")
    if not m.get("shards"):
        raise DataError(f"the training data in {where.parent} holds no sample (its manifest {where} lists no shards)",
                        "rebuild the data: no sample survived (check build-data's stats.json)")
    return m


def read_manifest(data_dir: Path) -> DataManifest:
    """The training-data manifest of ``data_dir``, validated by :func:`validate_manifest`.

    Raises:
        DataError: missing, not JSON, of an unknown schema or without shards; the message says which command
            writes it.
    """
    f = manifest_path(data_dir)
    if not f.is_file():
        raise DataError(f"no training data manifest at {f}", "run `draftsmith build-data --run RUN` first")
    try:
        m = json.loads(f.read_text())
    except ValueError as e:
        raise DataError(f"the data manifest {f} is not valid JSON: {e}", "rebuild it with `draftsmith build-data`") from e
    return validate_manifest(m, f)


@dataclass
class DataShard:
    """The samples of one data shard, in the shard's order: ``input_ids`` int64 ``[T_s]`` and ``loss_mask`` bool
    ``[T_s]`` per sample."""

    input_ids: list
    loss_mask: list


def read_shard(data_dir: Path, entry: ShardEntry) -> DataShard:
    """Read one data shard and check it against its manifest entry.

    Raises:
        DataError: the file is missing or disagrees with its manifest entry (sample count, lengths).
    """
    from safetensors.torch import load_file

    f = run_location(data_dir) / entry["file"]
    if not f.is_file():
        raise DataError(f"data shard {f} listed in the manifest is missing", "rebuild the data")
    t = load_file(str(f))
    ids, mask, off = t["input_ids"].long(), t["loss_mask"].bool(), t["offsets"].long()  # [T_total] x2, [S+1]
    bounds = [(int(off[s]), int(off[s + 1])) for s in range(off.numel() - 1)]
    lengths = [b - a for a, b in bounds]
    if lengths != list(entry["lengths"]) or len(bounds) != len(entry["sample_ids"]):
        raise DataError(f"data shard {f} does not match its manifest entry (lengths or sample count)",
                        "rebuild the data")
    return DataShard([ids[a:b] for a, b in bounds], [mask[a:b] for a, b in bounds])
