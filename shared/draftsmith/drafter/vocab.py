"""Draft vocabulary and initialisation from the target: embedding (frozen), ``lm_head`` from the target's rows.

The draft vocabulary files are written by ``build-data`` (``docs/formats.md`` section 3): ``d2t`` int64 ``[N]``
with target id = ``i + d2t[i]``, ``t2d`` bool ``[V]`` with exactly N true entries.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from draftsmith.artifacts import data as data_artifact
from draftsmith.artifacts import vocab as vocab_artifact
from draftsmith.errors import DataError, ModelError
from draftsmith.log import get_logger
from draftsmith.target.checkpoint import load_final_norm

log = get_logger(__name__)


def check_mapping(d2t: torch.Tensor, t2d: torch.Tensor) -> None:
    """Validate a d2t/t2d pair.

    Raises:
        DataError: t2d does not mark exactly the targets of d2t, or ids are out of range or unsorted.
    """
    ids = torch.arange(d2t.numel()) + d2t  # [N] target ids
    if ids.min() < 0 or ids.max() >= t2d.numel():
        raise DataError("draft vocabulary maps outside the target vocabulary", "rebuild it with `build-data`")
    if int(t2d.sum()) != d2t.numel() or not bool(t2d[ids].all()):
        raise DataError("d2t and t2d of the draft vocabulary disagree", "rebuild it with `build-data`")
    if d2t.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
        raise DataError("draft vocabulary ids are not sorted and unique", "rebuild it with `build-data`")


def mapping_hash(d2t: torch.Tensor) -> str:
    """sha256 (16 hex) of the draft-to-target mapping; stored in checkpoints to catch a stale mapping."""
    return hashlib.sha256(d2t.to(torch.int64).contiguous().numpy().tobytes()).hexdigest()[:16]


def load_draft_vocab(data_dir: Path | str, size: int) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Read ``data/vocab/draft-<size>.safetensors`` (+ its json).

    Returns:
        ``(d2t [N] int64, t2d [V] bool, meta dict)``.

    Raises:
        DataError: the files are missing or inconsistent.
    """
    from safetensors.torch import load_file

    vdir = data_artifact.vocab_dir(data_dir)
    st = vocab_artifact.mapping_path(vdir, size)
    if not st.is_file():
        have = vocab_artifact.mapping_files(vdir)
        raise DataError(
            f"no draft vocabulary of size {size} at {st} (have: {', '.join(have) or 'none'})",
            "run `draftsmith build-data` with this vocabulary size, or set train.draft_vocab_size to one you have",
        )
    t = load_file(str(st))
    d2t, t2d = t["d2t"].to(torch.long), t["t2d"].to(torch.bool)
    check_mapping(d2t, t2d)
    meta = vocab_artifact.read_meta(vdir, size) or {}
    return d2t, t2d, meta


def load_target_head(target_path: Path | str) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's token embedding and output head, fp32.

    Returns:
        ``(embed [V, H], lm_head [V, H])``; equal tensors for tied embeddings.

    Raises:
        ModelError: no safetensors weights or no embedding in them.
    """
    from safetensors import safe_open

    folder = Path(target_path)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelError(f"no *.safetensors weights in {folder}", "point target.path at a checkpoint folder")
    embed = head = None
    for f in files:
        with safe_open(str(f), "pt") as sf:
            for key in sf.keys():
                if key.endswith("embed_tokens.weight") and "vision" not in key:
                    embed = sf.get_tensor(key).float()
                elif key == "lm_head.weight" or key.endswith(".lm_head.weight"):
                    head = sf.get_tensor(key).float()
    if embed is None:
        raise ModelError(f"no embed_tokens.weight in {folder}", "is this a decoder-only language model?")
    return embed, head if head is not None else embed


def load_target_final_norm(target_path: Path | str) -> torch.Tensor:
    """The weight ``[H]`` of the target's final RMSNorm, fp32, found by name
    (:func:`draftsmith.target.checkpoint.final_norm_key`: ``model.norm.weight``, or a wrapped multimodal
    checkpoint's such as Kimi-K2.5's ``language_model.model.norm.weight``).

    Raises:
        ModelError: no such weight in the checkpoint's safetensors files.
    """
    return load_final_norm(Path(target_path)).float()


def init_from_target(model, target_path: Path | str, d2t: torch.Tensor, t2d: torch.Tensor, lm_head: str = "target",
                     norm: str = "ones"):
    """Copy the frozen embedding and (by default) the draft rows of the target's ``lm_head`` into ``model``.

    Args:
        model: an :class:`~draftsmith.drafter.families.eagle3.model.Eagle3Drafter`.
        d2t, t2d: the draft vocabulary (copied into the model's buffers).
        lm_head: ``"target"`` (rows ``i + d2t[i]`` of the target head) or ``"random"`` (keep the random init).
        norm: ``"target"`` copies the target's final norm weight into the drafter's final norm (so that, with the
            target's ``lm_head`` rows, the drafter starts from the target's own output geometry); ``"ones"`` keeps
            the default init.

    Returns:
        The target's full ``lm_head`` ``[V, H]`` (the trainer needs it for the target distribution).

    Raises:
        ModelError: the embedding shape differs from the drafter's config.
    """
    embed, head = load_target_head(target_path)
    if tuple(embed.shape) != tuple(model.embed_tokens.weight.shape):
        raise ModelError(
            f"target embedding {tuple(embed.shape)} does not fit the drafter {tuple(model.embed_tokens.weight.shape)}",
            "derive the drafter config from this target",
        )
    with torch.no_grad():
        model.embed_tokens.weight.copy_(embed)
        model.d2t.copy_(d2t)
        model.t2d.copy_(t2d)
        if lm_head == "target":
            model.lm_head.weight.copy_(head[torch.arange(d2t.numel()) + d2t])
        if norm == "target":
            model.norm.weight.copy_(load_target_final_norm(target_path))
    return head
