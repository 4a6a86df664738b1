"""The feature store: safetensors shards + per-shard sidecars + ``manifest.json`` (formats.md §4), and status.

Write order of one shard, each step atomic (temporary name + ``os.replace``): ``features-NNNNN.safetensors``
(written sample by sample as features are made, :mod:`draftsmith.features.writer`), then its sidecar
``features-NNNNN.json``. A shard is done when its sidecar exists and names the file's sha256;
a killed job leaves at most a hidden ``.features-NNNNN.safetensors.tmp-PID`` that the next run removes.
The manifest is rebuilt from the sidecars under a file lock, so parallel jobs never lose each other's shards.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

from draftsmith.artifacts import features as artifact
from draftsmith.artifacts.features import FEATURES_SCHEMA as MANIFEST_SCHEMA  # noqa: F401 (re-exported)
from draftsmith.artifacts.features import SHARD_SCHEMA, FeatureStore, shard_file, sidecar_file  # noqa: F401 (re-exported)
from draftsmith.artifacts.status import snapshot_path, stage_snapshot
from draftsmith.artifacts.storage import atomic_write_text
from draftsmith.errors import DataError, DiskSpaceError, is_disk_full
from draftsmith.features.plan import ExtractPlan, sha256_file
from draftsmith.log import get_logger

log = get_logger(__name__)

# run-level manifest fields that must not change between a run and its resume
_PINNED = (
    "target_model",
    "target_revision",
    "tokenizer_sha256",
    "layer_ids",
    "hidden_size",
    "dtype",
    "data_manifest_sha256",
)


@contextmanager
def locked(features_dir: Path):
    """Exclusive ``flock`` on ``features/.lock`` (serialises manifest and status rewrites across workers)."""
    features_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(features_dir / artifact.LOCK_FILE, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def read_sidecar(features_dir: Path, index: int) -> dict | None:
    """The sidecar of shard ``index`` if the shard is complete (sidecar and file both present), else None."""
    side = Path(features_dir) / sidecar_file(index)
    if not side.is_file() or not (Path(features_dir) / shard_file(index)).is_file():
        return None
    return json.loads(side.read_text())


def remove_stale_temps(features_dir: Path, index: int) -> int:
    """Delete temporary files a killed writer of shard ``index`` left behind; returns how many."""
    n = 0
    for f in Path(features_dir).glob(f".features-{index:05d}.*"):
        f.unlink(missing_ok=True)
        n += 1
    return n


def check_compatible(plan: ExtractPlan) -> None:
    """Refuse to add shards to a feature store extracted with other layers, dtype, target or data.

    Raises:
        DataError: an existing ``manifest.json`` disagrees with the plan on a pinned field.
    """
    old = artifact.load_manifest(plan.features_dir)
    if old is None:
        return
    new = plan.manifest_header()
    diff = [k for k in _PINNED if old.get(k) != new.get(k)]
    if diff:
        raise DataError(
            f"{plan.features_dir} holds features extracted with other {', '.join(diff)} "
            f"({', '.join(f'{k}={old.get(k)!r}' for k in diff)})",
            f"delete {plan.features_dir} to extract again, or run with the settings it was made with",
        )


def shard_metadata(plan: ExtractPlan) -> dict[str, str]:
    """The safetensors ``__metadata__`` of a feature shard (formats.md §4)."""
    return {
        "schema": SHARD_SCHEMA,
        "layer_ids": json.dumps(plan.layer_ids),
        "final_hidden": "post_norm",
        "target_model": plan.target_model,
    }


@contextmanager
def open_shard(plan: ExtractPlan, index: int, lengths: Sequence[int]):
    """A :class:`~draftsmith.features.writer.ShardWriter` on shard ``index``'s temporary file (in the features
    folder, the run's own disk); on a clean exit the caller calls :func:`finish_shard`, on any error the temporary
    file is removed and a full disk becomes one :class:`DiskSpaceError`.

    Args:
        lengths: tokens of every sample of the data shard, in shard order.
    """
    from draftsmith.features.hf import torch_dtype
    from draftsmith.features.writer import ShardWriter

    d = plan.features_dir
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{shard_file(index)}.tmp-{os.getpid()}"
    w = None
    try:
        w = ShardWriter(
            tmp, lengths, plan.hidden_size, torch_dtype(plan.dtype), shard_metadata(plan), len(plan.layer_ids)
        )
        yield w
    except (
        BaseException
    ) as e:  # a full disk mid-shard: nothing half-written stays, the shard is redone next run
        if w is not None:
            w.close()
        tmp.unlink(missing_ok=True)
        _raise_if_disk_full(e, d, index)
        raise


def finish_shard(
    plan: ExtractPlan, index: int, writer, sample_ids: Sequence[str], skipped: list[dict], seconds: float
) -> dict:
    """Finish the shard ``writer`` wrote (:meth:`ShardWriter.finish`), rename it into place, then write its sidecar;
    each step atomic.

    Args:
        writer: the :class:`~draftsmith.features.writer.ShardWriter` of :func:`open_shard`, every sample written
            or skipped.
        sample_ids: every sample's id of the data shard, in shard order.
        skipped: ``[{"id", "reason"}]`` samples left out (e.g. non-finite features), in shard order.
        seconds: compute time of the shard (for rates).

    Returns:
        The sidecar dict (file, sample_ids, lengths, sha256, bytes, tokens, skipped, seconds, ...).
    """
    d = plan.features_dir
    path = d / shard_file(index)
    kept = writer.finish()
    os.replace(writer.path, path)
    lengths = [writer.lengths[i] for i in kept]
    side = {
        "schema": SHARD_SCHEMA,
        "file": path.name,
        "data_shard": index,
        "sample_ids": [sample_ids[i] for i in kept],
        "lengths": lengths,
        "tokens": int(sum(lengths)),
        "sha256": sha256_file(path),
        "bytes": path.stat().st_size,
        "skipped": skipped,
        "seconds": round(seconds, 3),
        "finished_at": time.time(),
    }
    try:
        atomic_write_text(d / sidecar_file(index), json.dumps(side, indent=1))
    except (
        BaseException
    ) as e:  # a shard without its sidecar is never counted: remove it, it is redone next run
        path.unlink(missing_ok=True)
        _raise_if_disk_full(e, d, index)
        raise
    return side


def _raise_if_disk_full(e: BaseException, features_dir: Path, index: int) -> None:
    """Turn a full disk while writing shard ``index`` into one :class:`DiskSpaceError` line."""
    if is_disk_full(e):
        free = shutil.disk_usage(features_dir).free
        raise DiskSpaceError(
            f"the disk filled up while writing feature shard {index} under {features_dir} ({free / 1e6:.1f} MB free)",
            "free some space or point runs_dir at a bigger disk, then run `draftsmith extract` again: finished "
            "shards are kept",
        ) from e


class LocalFeatureStore(FeatureStore):
    """The feature shards of a run on a local disk: extraction writes them in place (the working copy is the run),
    and the manifest is rebuilt under the folder's ``flock`` so parallel jobs never lose each other's shards."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.features_dir = self.root / artifact.FEATURES_DIR

    def working_copy(self) -> Path:
        return self.root

    def done_shards(self) -> set[int]:
        return {artifact.shard_index(s["file"]) for s in artifact.complete_sidecars(self.features_dir)}

    def sidecar(self, index: int) -> dict | None:
        return read_sidecar(self.features_dir, index)

    def write_manifest(self, manifest: dict) -> None:
        artifact.write_manifest(self.features_dir, manifest)

    def rebuild_manifest(self, header: dict) -> dict:
        with locked(self.features_dir):
            return super().rebuild_manifest(header)


def rebuild_manifest(plan: ExtractPlan) -> dict:
    """Rewrite ``features/manifest.json`` of the plan's folder from its complete shards' sidecars (under the lock).

    Returns:
        The manifest: :meth:`ExtractPlan.manifest_header` plus ``shards`` (file, sample_ids, lengths, sha256,
        skipped) in index order, ``samples``, ``tokens`` and ``skipped_samples``.
    """
    return LocalFeatureStore(Path(plan.features_dir).parent).rebuild_manifest(plan.manifest_header())


def write_status(plan: ExtractPlan, status_dir: Path, started_at: float | None = None) -> dict:
    """Write ``runs/<run>/status/extract.json`` (the one snapshot shape, :func:`draftsmith.artifacts.status.stage_snapshot`):
    progress, rates, bytes and free disk.

    Rates: ``tokens_per_s`` / ``samples_per_s`` count shards finished since ``started_at`` (the extract command's
    start, kept in the file across calls) over the elapsed wall time; ``compute_tokens_per_s`` is tokens over the
    summed compute seconds of all finished shards (one worker's speed).
    """
    status_dir = Path(status_dir)
    f = snapshot_path(status_dir.parent, "extract")
    with locked(plan.features_dir):
        old = json.loads(f.read_text()) if f.is_file() else {}
        started = started_at or old.get("started_at") or time.time()
        sides = [s for i in range(len(plan.shards)) if (s := read_sidecar(plan.features_dir, i))]
        recent = [s for s in sides if s.get("finished_at", 0) >= started]
        elapsed = max(time.time() - started, 1e-9)
        secs = sum(s["seconds"] for s in sides)
        numbers = {
            "started_at": started,
            "backend": plan.backend,
            "shards_done": len(sides),
            "shards_total": len(plan.shards),
            "samples_done": sum(len(s["sample_ids"]) for s in sides),
            "samples_total": sum(len(s["sample_ids"]) for s in plan.shards),
            "tokens_done": sum(s["tokens"] for s in sides),
            "tokens_total": sum(sum(s["lengths"]) for s in plan.shards),
            "skipped_samples": sum(len(s["skipped"]) for s in sides),
            "bytes_written": sum(s["bytes"] for s in sides),
            "estimated_bytes_total": plan.estimate_bytes(),
            "free_disk_bytes": shutil.disk_usage(plan.features_dir).free,
            "samples_per_s": round(sum(len(s["sample_ids"]) for s in recent) / elapsed, 3),
            "tokens_per_s": round(sum(s["tokens"] for s in recent) / elapsed, 1),
            "compute_tokens_per_s": round(sum(s["tokens"] for s in sides) / secs, 1) if secs else 0.0,
        }
        n = numbers
        line = (
            f"shards {n['shards_done']}/{n['shards_total']}, samples {n['samples_done']}/{n['samples_total']}, "
            f"tokens {n['tokens_done']}/{n['tokens_total']}, {n['tokens_per_s']:.0f} tok/s, "
            f"{n['bytes_written'] / 1e6:.1f} MB written, {n['free_disk_bytes'] / 1e9:.1f} GB free, "
            f"skipped {n['skipped_samples']}"
        )
        done = n["shards_total"] > 0 and n["shards_done"] >= n["shards_total"]
        snap = stage_snapshot("extract", "done" if done else "running", line, **numbers)
        status_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(f, json.dumps(snap, indent=1))
    return snap
