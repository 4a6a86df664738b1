"""What an extraction run will do, validated before any model loads: inputs, layers, tokenizer, disk estimate.

Built the same way by ``draftsmith extract`` (to refuse early and enqueue) and by each rq job (to stay
consistent with what was enqueued). Reads the training data of formats.md §3.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from draftsmith.artifacts import data as data_artifact
from draftsmith.artifacts import features as features_artifact
from draftsmith.artifacts.data import DATA_SCHEMA  # noqa: F401 (re-exported)
from draftsmith.data.render import load_tokenizer, tokenizer_files
from draftsmith.data.render import tokenizer_sha256 as data_tokenizer_sha256
from draftsmith.errors import DataError, DiskSpaceError
from draftsmith.features.hf import target_config
from draftsmith.features.layers import parse_layer_ids, vllm_aux_ids
from draftsmith.precision import compute_dtype
from draftsmith.target.checkpoint import read_target_config, target_checkpoint, target_config_path
from draftsmith.target.embedded import EMBEDDED_NAME

BYTES_PER_VALUE = {"bfloat16": 2, "float16": 2, "float32": 4}


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def tokenizer_sha256(model_dir: Path, chat_template: str | None = None, trust_remote_code: bool = False) -> str:
    """The tokenizer hash ``build-data`` records in the data manifest, computed for the target's folder.

    Same function as the data stage (:func:`draftsmith.data.render.tokenizer_sha256`: the tokenizer's files,
    ``tokenizer.json`` or a tiktoken/sentencepiece vocabulary with its code, plus the chat template in use,
    ``data.chat_template`` when set).

    Raises:
        DataError: the tokenizer cannot be loaded or has no chat template; ModelError: it is the checkpoint's own
            code and ``trust_remote_code`` is off.
    """
    # a resident extraction worker plans every shard it takes: the tokenizer is loaded once per folder state
    stamp = tuple((f.name, f.stat().st_mtime_ns, f.stat().st_size) for f in sorted(Path(model_dir).glob("*"))
                  if f.is_file() and (f.name.startswith(("tokenizer", "chat_template", "special_tokens"))
                                      or f in tokenizer_files(model_dir)))
    if chat_template and Path(chat_template).is_file():
        stamp += ((str(chat_template), Path(chat_template).stat().st_mtime_ns),)
    return _tokenizer_sha256(str(model_dir), chat_template, stamp, trust_remote_code)


@functools.lru_cache(maxsize=8)
def _tokenizer_sha256(model_dir: str, chat_template: str | None, stamp: tuple, trust_remote_code: bool) -> str:
    return data_tokenizer_sha256(load_tokenizer(model_dir, chat_template, trust_remote_code), model_dir)


def target_revision(model_dir: Path) -> str:
    """A revision string for the target: the prepared marker's GGUF or weights hash (embedded and tiny MLA
    targets), a hub commit, or config.json's hash."""
    d = Path(model_dir)
    marker = d / "draftsmith-prepared.json"
    if marker.is_file():
        m = json.loads(marker.read_text())
        if m.get("gguf_sha256"):
            return "gguf-sha256:" + m["gguf_sha256"]
        if m.get("weights_sha256"):
            return "weights-sha256:" + m["weights_sha256"]
    cfg = read_target_config(d)
    if cfg.get("_commit_hash"):
        return str(cfg["_commit_hash"])
    return "config-sha256:" + sha256_file(target_config_path(d))


def load_data_manifest(data_dir: Path) -> dict:
    """The training-data manifest (formats.md §3): :func:`draftsmith.artifacts.data.read_manifest`.

    Raises:
        DataError: missing, unreadable, of an unknown schema or without shards.
    """
    return dict(data_artifact.read_manifest(data_dir))


def read_data_shard(data_dir: Path, entry: dict) -> list[torch.Tensor]:
    """Token ids of every sample of one data shard, ``[T_s]`` int64 each, in the shard's order
    (:func:`draftsmith.artifacts.data.read_shard`).

    Raises:
        DataError: the file is missing or disagrees with its manifest entry (sample count, lengths).
    """
    return data_artifact.read_shard(data_dir, entry).input_ids


@dataclass
class ExtractPlan:
    """Resolved inputs of one extraction run (JSON-serialisable; jobs rebuild it from the settings).

    Attributes:
        run_dir: ``runs/<run>``.
        target_dir: target checkpoint folder.
        layer_ids: aux layer ids, output of decoder layer i (:mod:`draftsmith.features.layers`).
        hidden_size: H of the target; num_layers: its decoder layers.
        dtype: stored dtype; compute_dtype: dtype of the forward pass.
        shards: the data manifest's shard entries (index = feature shard index).
        batch_tokens: padded tokens per forward pass (``extract.batch_tokens``).
        write_tokens: tokens of features held before they are written (``extract.write_tokens``; None = from the
            free memory, :func:`draftsmith.features.writer.write_budget`).
    """

    run_dir: str
    target_dir: str
    target_model: str
    target_revision: str
    tokenizer_sha256: str
    data_manifest_sha256: str
    layer_ids: list[int]
    hidden_size: int
    num_layers: int
    dtype: str
    compute_dtype: str
    backend: str
    shards: list[dict] = field(default_factory=list)
    batch_tokens: int = 4096
    write_tokens: int | None = None

    @property
    def data_dir(self) -> Path:
        return Path(self.run_dir) / "data"

    @property
    def features_dir(self) -> Path:
        return Path(self.run_dir) / "features"

    def manifest_header(self) -> dict:
        """The run-level fields of ``features/manifest.json`` (formats.md §4, plus ``vllm_aux_layer_ids``)."""
        return {
            "schema": features_artifact.FEATURES_SCHEMA,
            "target_model": self.target_model,
            "target_revision": self.target_revision,
            "tokenizer_sha256": self.tokenizer_sha256,
            "layer_ids": list(self.layer_ids),
            "layer_convention": "output of decoder layer i (transformers hidden_states[i+1])",
            "vllm_aux_layer_ids": vllm_aux_ids(self.layer_ids),
            "hidden_size": self.hidden_size,
            "dtype": self.dtype,
            "final_hidden": "post_norm",
            "backend": self.backend,
            "data_manifest_sha256": self.data_manifest_sha256,
            "shards_total": len(self.shards),
        }

    def bytes_per_token(self) -> int:
        """Stored bytes per token: ``(aux layers + 1) * H * bytes per value`` (docs/extraction.md: 4,608 B/token for SmolLM2 in bf16)."""
        return (len(self.layer_ids) + 1) * self.hidden_size * BYTES_PER_VALUE[self.dtype]

    def estimate_bytes(self, shard_indices: list[int] | None = None) -> int:
        """Estimated feature bytes of the given shards (all by default); headers and offsets are negligible."""
        idx = range(len(self.shards)) if shard_indices is None else shard_indices
        return sum(sum(self.shards[i]["lengths"]) for i in idx) * self.bytes_per_token()

    def to_dict(self) -> dict:
        return asdict(self)


def make_plan(settings, run_dir: Path) -> ExtractPlan:
    """Validate inputs and resolve the plan; touches no model weights and writes nothing.

    Args:
        settings: :class:`draftsmith.config.Settings`.
        run_dir: ``runs/<run>``.

    Raises:
        DataError: missing or malformed data manifest; ModelError: unreadable target;
        ConfigError: layer ids out of range; DataError: the target's tokenizer differs from the data's.
    """
    run_dir = Path(run_dir)
    data_dir = run_dir / "data"
    manifest = load_data_manifest(data_dir)
    target_dir = target_checkpoint(settings)
    cfg = target_config(target_dir)
    num_layers = int(cfg["num_hidden_layers"])
    layer_ids = parse_layer_ids(settings.extract.layers, num_layers)
    tok_sha = tokenizer_sha256(target_dir, settings.data.chat_template, settings.target.trust_remote_code)
    data_tok = (manifest.get("tokenizer") or {}).get("sha256")
    if data_tok != tok_sha:
        raise DataError(
            f"the target's tokenizer (in {target_dir}, sha256 {tok_sha[:12]}) differs from the one the "
            f"data was built with (sha256 {str(data_tok)[:12]}, {manifest.get('tokenizer', {}).get('path')})",
            "extract with the target the data was built for (target.path), or rebuild the data",
        )
    return ExtractPlan(
        run_dir=str(run_dir),
        target_dir=str(target_dir),
        target_model=manifest.get("target_model") or (settings.target.model or target_dir.name or EMBEDDED_NAME),
        target_revision=target_revision(target_dir),
        tokenizer_sha256=tok_sha,
        data_manifest_sha256=sha256_file(data_artifact.manifest_path(data_dir)),
        layer_ids=list(layer_ids),
        hidden_size=int(cfg["hidden_size"]),
        num_layers=num_layers,
        dtype=settings.extract.dtype,
        compute_dtype=compute_dtype(settings.extract.compute_dtype, settings.extract.device),
        backend=settings.extract.backend,
        shards=list(manifest["shards"]),
        batch_tokens=settings.extract.batch_tokens,
        write_tokens=settings.extract.write_tokens,
    )


def check_disk(plan: ExtractPlan, pending: list[int], margin: float = 1.1) -> tuple[int, int]:
    """Refuse when the disk cannot hold the pending shards' features.

    Returns:
        ``(estimated_bytes, free_bytes)``.

    Raises:
        DiskSpaceError: ``estimate * margin`` exceeds the free space of the features folder's file system; the
        message suggests streaming (features computed on the fly by the trainer, no store).
    """
    need = plan.estimate_bytes(pending)
    probe = plan.features_dir if plan.features_dir.exists() else Path(plan.run_dir)
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if need * margin > free:
        tokens = sum(sum(plan.shards[i]["lengths"]) for i in pending)
        raise DiskSpaceError(
            f"features of {tokens:,} tokens need about {need / 1e9:.2f} GB ({plan.bytes_per_token()} B/token x "
            f"{margin} margin) but {probe} has {free / 1e9:.2f} GB free",
            "free disk space or point runs_dir at a bigger disk, or skip the store: train with streamed features "
            "(`draftsmith train --run R` with DRAFTSMITH_TRAIN__FEATURES=stream computes them on the fly from the "
            "target; docs/extraction.md, which mode fits which job)",
        )
    return need, free
