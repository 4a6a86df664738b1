"""The draft vocabulary: the N most frequent supervised tokens, as EAGLE-3's ``d2t`` / ``t2d`` (docs/formats.md §3).

Source: EAGLE-3 (Li et al., 2025) and its official code: count target tokens over the loss-masked positions of
the training data, keep the top N sorted by id; ``d2t[i]`` is an offset (``target_id = i + d2t[i]``) and ``t2d`` a
boolean mask over the target vocabulary. The mapping is stored with a hash of the data it came from
(``data_hash``), so a stale mapping is detectable (failure mode 13), and with the counts, so any N is rebuilt
without regenerating or re-extracting anything.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from draftsmith.artifacts import vocab as artifact
from draftsmith.artifacts.storage import atomic_write_bytes
from draftsmith.artifacts.vocab import COUNTS_FILE, VOCAB_SCHEMA
from draftsmith.errors import DataError
from draftsmith.log import get_logger

log = get_logger(__name__)



def count_tokens(input_ids, loss_mask, vocab_size: int):
    """Frequencies of supervised tokens.

    Args:
        input_ids: int tensor ``[T]``.
        loss_mask: uint8/bool tensor ``[T]`` (1 = supervised).
        vocab_size: target vocabulary size V.

    Returns:
        int64 tensor ``[V]``.
    """
    import torch

    ids = input_ids[loss_mask.bool()].long()  # [T_sup]
    return torch.bincount(ids, minlength=vocab_size)[:vocab_size]


def build_draft_vocab(counts, n: int):
    """Top-``n`` tokens by count (ties: lower id first), sorted by id.

    Unseen tokens fill the remaining slots by lowest id when fewer than ``n`` tokens were seen.

    Args:
        counts: int64 ``[V]`` supervised-token frequencies.
        n: draft vocabulary size N.

    Returns:
        ``(d2t, t2d, coverage)``: int64 ``[N]`` offsets (``target_id = i + d2t[i]``), bool ``[V]`` mask with exactly
        N true entries, and the fraction of supervised tokens inside the draft vocabulary (0..1).

    Raises:
        DataError: ``n`` is not in ``[1, V]``.
    """
    import numpy as np
    import torch

    v = counts.numel()
    if not 1 <= n <= v:
        raise DataError(f"draft vocabulary size {n} is outside [1, {v}]", f"pick data.draft_vocab_size <= {v}")
    # a stable sort on -count keeps lower ids first among equal counts (numpy: torch.sort is slow on busy CPUs)
    order = np.argsort(-counts.numpy(), kind="stable")  # [V]
    kept = torch.from_numpy(np.sort(order[:n])).to(torch.int64)  # [N] target ids, ascending
    d2t = kept - torch.arange(n)  # [N]
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[kept] = True
    total = int(counts.sum())
    coverage = float(counts[kept].sum()) / total if total else 0.0
    return d2t, t2d, coverage


def data_hash(shard_sha256s: list[str]) -> str:
    """sha256 over the data shards' sha256 strings, in shard order (what a draft vocabulary was built from)."""
    h = hashlib.sha256()
    for s in shard_sha256s:
        h.update(s.encode())
    return h.hexdigest()


def save_counts(vocab_dir: Path, counts, dhash: str) -> None:
    """Write ``vocab/counts.safetensors`` (``counts`` int64 ``[V]``) with the data hash in its metadata."""
    from safetensors.torch import save

    atomic_write_bytes(artifact.counts_path(vocab_dir), save({"counts": counts.contiguous()}, {"data_hash": dhash}))


def load_counts(vocab_dir: Path):
    """Read ``vocab/counts.safetensors``; returns ``(counts [V], data_hash)``.

    Raises:
        DataError: the file is missing (run build-data first).
    """
    from safetensors import safe_open

    path = artifact.counts_path(vocab_dir)
    if not path.is_file():
        raise DataError(f"no token counts at {path}", "run `draftsmith build-data` for this run first")
    with safe_open(str(path), "pt") as f:
        return f.get_tensor("counts"), (f.metadata() or {}).get("data_hash", "")


def write_draft_vocab(vocab_dir: Path, n: int, counts=None, dhash: str | None = None) -> dict:
    """Build and write ``vocab/draft-<N>.safetensors`` and ``draft-<N>.json`` from the stored (or given) counts.

    Returns:
        The JSON metadata written (schema, size, target_vocab_size, coverage, data_hash, token_counts_file).
    """
    from safetensors.torch import save

    vocab_dir = Path(vocab_dir)
    if counts is None:
        counts, dhash = load_counts(vocab_dir)
    d2t, t2d, coverage = build_draft_vocab(counts, n)
    atomic_write_bytes(artifact.mapping_path(vocab_dir, n), save({"d2t": d2t, "t2d": t2d}, {"data_hash": dhash}))
    meta = {
        "schema": VOCAB_SCHEMA,
        "size": n,
        "target_vocab_size": int(counts.numel()),
        "coverage": round(coverage, 6),
        "data_hash": dhash,
        "token_counts_file": COUNTS_FILE,
        "supervised_tokens": int(counts.sum()),
        "distinct_tokens": int((counts > 0).sum()),
    }
    artifact.write_meta(vocab_dir, n, meta)
    log.info("draft vocabulary N=%d: coverage %.4f of %d supervised tokens", n, coverage, meta["supervised_tokens"])
    return meta
