"""The draft vocabulary under ``runs/<run>/data/vocab/`` (docs/formats.md §3): names, schema tag, metadata.

Layout: ``counts.safetensors`` (``counts`` int64 ``[V]``, metadata ``data_hash``), and per size N
``draft-N.safetensors`` (``d2t`` int64 ``[N]``, ``t2d`` bool ``[V]``) with ``draft-N.json`` (schema
:data:`VOCAB_SCHEMA`: ``size``, ``target_vocab_size``, ``coverage``, ``data_hash``, ``token_counts_file``, ...).
Writer: :mod:`draftsmith.data.vocab`; readers: :mod:`draftsmith.drafter.vocab` and ``draftsmith build-data``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from draftsmith.artifacts.location import run_location
from draftsmith.artifacts.storage import atomic_write_text

VOCAB_SCHEMA = "draftsmith.vocab/1"
COUNTS_FILE = "counts.safetensors"
DRAFT_GLOB = "draft-*.safetensors"


def counts_path(vocab_dir: Path) -> Path:
    """``vocab/counts.safetensors``."""
    return run_location(vocab_dir) / COUNTS_FILE


def mapping_path(vocab_dir: Path, n: int) -> Path:
    """``vocab/draft-<n>.safetensors`` (the ``d2t`` / ``t2d`` tensors)."""
    return run_location(vocab_dir) / f"draft-{n}.safetensors"


def meta_path(vocab_dir: Path, n: int) -> Path:
    """``vocab/draft-<n>.json`` (the metadata of :func:`mapping_path`)."""
    return run_location(vocab_dir) / f"draft-{n}.json"


def mapping_files(vocab_dir: Path) -> list[str]:
    """Names of the draft vocabularies present (``draft-N.safetensors``), sorted."""
    return sorted(p.name for p in run_location(vocab_dir).glob(DRAFT_GLOB))


def mapping_sizes(vocab_dir: Path) -> list[int]:
    """Sizes ``N`` of the draft vocabularies present (``draft-N.safetensors``), ascending; empty without the folder."""
    return sorted(int(name[len("draft-"):-len(".safetensors")]) for name in mapping_files(vocab_dir))


def write_meta(vocab_dir: Path, n: int, meta: dict[str, Any]) -> None:
    """Replace ``draft-<n>.json`` atomically (indent 2, trailing newline)."""
    atomic_write_text(meta_path(vocab_dir, n), json.dumps(meta, indent=2) + "\n")


def read_meta(vocab_dir: Path, n: int) -> dict[str, Any] | None:
    """The metadata ``draft-<n>.json``, or None when there is none.

    Raises:
        ValueError: the file is not JSON.
    """
    f = meta_path(vocab_dir, n)
    return json.loads(f.read_text()) if f.is_file() else None
