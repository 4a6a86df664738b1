"""Training checkpoints: atomic, rotated, complete enough to resume exactly (``docs/formats.md`` section 5).

``checkpoints/step-XXXXXXXX/`` holds ``model.safetensors`` (trainable weights + ``d2t``/``t2d``; the frozen
embedding is the target's and is not stored), ``optimizer.pt`` (the whole, unsharded AdamW state keyed by parameter
name, as ``torch.distributed.checkpoint.state_dict`` writes it: a checkpoint from one process, DDP or FSDP resumes
under any of them), ``scheduler.pt``, ``rng.pt`` (python, torch CPU and CUDA generators) and ``state.json`` (step, epoch, batch position, config, drafter config, vocab hash, target).
This module writes and reads the tensors; where the folder lives, its ``state.json``, ``latest.json``, rotation and
the copy to an object store are the run's :class:`~draftsmith.artifacts.checkpoints.CheckpointStore`'s.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

from draftsmith.artifacts import checkpoints as artifact
from draftsmith.artifacts.checkpoints import CheckpointStore
from draftsmith.artifacts.checkpoints import read_state as read_state  # re-exported for the drafter's callers
from draftsmith.artifacts.local_checkpoints import LocalCheckpointStore
from draftsmith.errors import ModelError
from draftsmith.log import get_logger

log = get_logger(__name__)

FROZEN = ("embed_tokens.weight",)


def model_state(model, full: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Weights to store: everything but the frozen embedding and the rotary buffers, contiguous, on CPU.

    ``full`` is an already gathered state dict (FSDP: :func:`full_model_state`); None reads ``model.state_dict()``.
    """
    sd = model.state_dict() if full is None else full
    return {k: v.detach().contiguous().cpu() for k, v in sd.items() if k not in FROZEN and not k.startswith("rotary.")}


def full_model_state(model) -> dict[str, torch.Tensor]:
    """The whole (unsharded) model state dict on CPU, keyed by parameter name.

    Collective under FSDP: every rank must call it; only rank 0 receives the tensors (the others get an empty dict).
    Works the same on a plain or DDP-wrapped module (PyTorch's ``torch.distributed.checkpoint.state_dict`` API).
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def full_optimizer_state(model, optimizer) -> dict[str, Any]:
    """The whole optimizer state dict on CPU, keyed by parameter name (collective under FSDP, like
    :func:`full_model_state`).

    Call it only after the first optimizer step: on an optimizer without state PyTorch initialises one by running
    ``step()`` with zero gradients, which advances AdamW's step count and changes the next updates.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def rng_state() -> dict[str, Any]:
    """Every random generator a step consumes."""
    s = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        s["cuda"] = torch.cuda.get_rng_state_all()
    return s


def set_rng_state(s: dict[str, Any]) -> None:
    random.setstate(s["python"])
    torch.set_rng_state(s["torch"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def save_checkpoint(store: CheckpointStore | Path, weights: dict[str, torch.Tensor], optimizer_state: dict[str, Any],
                    scheduler, state: dict[str, Any], keep: int) -> Path:
    """Save the checkpoint of ``state["step"]`` through ``store`` (a local folder stands for its local store): this
    function writes the tensors' files, the store places them, adds ``state.json``, moves ``latest.json`` and keeps
    the newest ``keep``. Returns the local checkpoint folder.

    Args:
        weights: :func:`model_state` (whole tensors, never FSDP shards).
        optimizer_state: :func:`full_optimizer_state`.

    Raises:
        OSError: the local write failed; StorageError: the object store failed (the previous checkpoint stays the
            latest in both cases).
    """
    from safetensors.torch import save_file

    def write(folder: Path) -> None:
        save_file(weights, str(folder / artifact.WEIGHTS_FILE), metadata={"format": "pt"})
        torch.save(optimizer_state, folder / artifact.OPTIMIZER_FILE)
        torch.save(scheduler.state_dict(), folder / artifact.SCHEDULER_FILE)
        torch.save(rng_state(), folder / artifact.RNG_FILE)

    return _store(store).save(write, state, keep)


def _store(store: CheckpointStore | Path) -> CheckpointStore:
    return store if isinstance(store, CheckpointStore) else LocalCheckpointStore(Path(store))


def list_checkpoints(folder: Path) -> list[Path]:
    """Complete checkpoints of the local ``folder``, oldest WRITTEN first
    (:meth:`~draftsmith.artifacts.local_checkpoints.LocalCheckpointStore.list`)."""
    return LocalCheckpointStore(folder).list()


def latest_checkpoint(folder: Path) -> Path | None:
    """The checkpoint ``latest.json`` of the local ``folder`` names (or the newest complete one), None when there is
    none."""
    return LocalCheckpointStore(folder).latest()


def resolve_checkpoint(run_checkpoints: Path, name: str | None) -> Path:
    """A checkpoint folder of the local ``run_checkpoints`` from a name (``step-00000100``, a path) or the latest.

    Raises:
        ModelError: nothing found.
    """
    return LocalCheckpointStore(run_checkpoints).resolve(name)


def load_model_weights(model, ckpt: Path) -> None:
    """Load ``model.safetensors`` strictly (every stored key must match, nothing may be missing).

    Raises:
        ModelError: unreadable file, missing/unexpected keys or shape mismatch.
    """
    from safetensors.torch import load_file

    try:
        sd = load_file(str(ckpt / artifact.WEIGHTS_FILE))
    except Exception as e:  # safetensors raises its own error types for corrupt files
        raise ModelError(f"cannot read {ckpt / artifact.WEIGHTS_FILE}: {e}", "the checkpoint is corrupt; pick another") from e
    want = model_state(model)
    missing, extra = sorted(set(want) - set(sd)), sorted(set(sd) - set(want))
    bad = [k for k in want if k in sd and tuple(sd[k].shape) != tuple(want[k].shape)]
    if missing or extra or bad:
        raise ModelError(
            f"checkpoint {ckpt} does not fit this drafter (missing {missing[:4]}, unexpected {extra[:4]}, "
            f"shape mismatch {bad[:4]})", "it comes from another architecture or config",
        )
    model.load_state_dict(sd, strict=False)


def load_optimizer_state(ckpt: Path, model, optimizer, scheduler) -> None:
    """Restore optimizer, scheduler and RNG from ``ckpt`` (the weights go first, with :func:`load_model_weights`,
    before the model is sharded). Under FSDP every rank calls it; each takes its shard of the whole state.

    Raises:
        ModelError: the optimizer state names parameters this drafter does not have (another architecture), or
            groups them otherwise (another ``train.optimizer``).
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    osd = load_plain(ckpt / artifact.OPTIMIZER_FILE)
    # PyTorch's loader fails on another grouping with a bare AssertionError ("Expected device to be set"), so the
    # parameter groups (one per optimizer here: AdamW, or Muon then AdamW) are compared first
    saved = [len(g["params"]) for g in osd.get("param_groups", [])]
    opts = [optimizer] if isinstance(optimizer, torch.optim.Optimizer) else list(optimizer)  # one, or Optimizers
    wanted = [len(g["params"]) for o in opts for g in o.param_groups]
    if saved != wanted:
        raise ModelError(f"optimizer state of {ckpt} has parameter groups of {saved} parameters, this drafter and "
                         f"train.optimizer have {wanted}",
                         "resume into the run that wrote it with its settings (train.optimizer), or set "
                         "train.resume=false to start over")
    try:
        set_optimizer_state_dict(model, optimizer, osd, options=StateDictOptions(full_state_dict=True))
        scheduler.load_state_dict(load_plain(ckpt / artifact.SCHEDULER_FILE))
    except (KeyError, RuntimeError, ValueError) as e:
        raise ModelError(f"optimizer state of {ckpt} does not fit this drafter and train.optimizer ({e})",
                         "resume into the run that wrote it with its settings, or set train.resume=false to start "
                         "over") from e
    set_rng_state(load_plain(ckpt / artifact.RNG_FILE))


def load_plain(path: Path) -> Any:
    """``torch.load`` with ``weights_only=True``: tensors, numbers, strings and containers only, never code (a
    checkpoint from elsewhere cannot run anything when loaded).

    Raises:
        ModelError: the file is missing, corrupt, or holds anything but plain data (a pickled object or callable).
    """
    import pickle

    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except (OSError, RuntimeError, pickle.UnpicklingError, EOFError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(f"cannot load {path} as plain tensors and numbers ({first[:200]})",
                         "the checkpoint is corrupt or was not written by draftsmith; pick another") from e
