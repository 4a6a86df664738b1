"""The target checkpoint folder and its ``config.json``: the one place every stage resolves them.

The folder is ``target.path`` when set (any Hugging Face checkpoint folder: ``config.json``, tokenizer, weights),
else the embedded default, SmolLM2-135M-Instruct under ``target.cache_dir`` (``draftsmith target prepare`` builds
it; see :mod:`draftsmith.target.embedded`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftsmith.artifacts.export import WEIGHTS_INDEX_FILE
from draftsmith.errors import ModelError
from draftsmith.target.embedded import embedded_dir, is_prepared, prepare_embedded

if TYPE_CHECKING:
    import torch

    from draftsmith.config import Settings


def target_checkpoint(s: Settings, prepare: bool = False) -> Path:
    """The target checkpoint folder of these settings.

    Args:
        s: settings; reads ``target.path`` and ``target.cache_dir``.
        prepare: build the embedded default when it is not prepared yet (``draftsmith target serve`` does;
            the stages that only read the target do not, they say how to prepare it).

    Raises:
        ModelError: ``target.path`` has no ``config.json``, or the embedded default is not prepared (and
            ``prepare`` is False).
    """
    if s.target.path:
        p = Path(s.target.path).expanduser()
        if not target_config_path(p).is_file():
            raise ModelError(f"target.path {p} is not a Hugging Face checkpoint folder (no config.json)",
                             "pass the folder that holds config.json, tokenizer and weights")
        return p
    p = embedded_dir(s.target.cache_dir)
    if is_prepared(p):
        return p
    if prepare:
        return prepare_embedded(s.target.cache_dir)
    raise ModelError(f"the embedded target is not prepared at {p}",
                     "run `draftsmith target prepare` (or set target.path to a checkpoint folder)")


CONFIG_FILE = "config.json"  # Hugging Face's name (transformers.utils.CONFIG_NAME); read here and nowhere else


def target_config_path(folder: Path | str) -> Path:
    """``<folder>/config.json``: where a checkpoint folder keeps its architecture (it may not exist)."""
    return Path(folder) / CONFIG_FILE


def read_target_config(folder: Path | str, text: bool = False) -> dict[str, Any]:
    """The target's ``config.json``, read without loading weights.

    Args:
        folder: the checkpoint folder.
        text: return the language model's part (``text_config`` of a multimodal config, else the whole config).

    Raises:
        ModelError: no readable ``config.json`` in ``folder``.
    """
    f = target_config_path(folder)
    if not f.is_file():
        raise ModelError(f"{f} does not exist", "point target.path at a Hugging Face checkpoint folder")
    try:
        cfg = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot read the target config {f}: {e}", "set target.path to a checkpoint folder") from e
    return cfg.get("text_config", cfg) if text else cfg


def weights_bytes(folder: Path) -> int | None:
    """Bytes of the target's weights in checkpoint ``folder``: the weight index's ``metadata.total_size``, else the
    ``*.safetensors`` files' sizes, else None (no weights there). Read by the planner and by extraction's free-memory
    check; no weights are loaded."""
    index = folder / WEIGHTS_INDEX_FILE
    if index.is_file():
        total = (json.loads(index.read_text()).get("metadata") or {}).get("total_size")
        if total:
            return int(total)
    files = list(folder.glob("*.safetensors"))
    return sum(f.stat().st_size for f in files) if files else None


def final_norm_key(names: Sequence[str]) -> str | None:
    """The weight name of the target's final norm among ``names``: ``norm.weight`` under the text model's root
    (``model.norm.weight``; ``model.language_model.norm.weight`` or ``language_model.model.norm.weight`` in wrapped
    multimodal checkpoints such as Kimi-K2.5's), never a layer's or the vision tower's norm. None when absent."""
    found = [n for n in names if n.endswith(".norm.weight") and ".layers." not in n
             and not any(part in n for part in ("vision", "visual", "mm_projector", "multi_modal", "mtp"))]
    found.sort(key=lambda n: (n.count("."), n))  # the shallowest: the text model's own final norm
    return found[0] if found else None


def load_final_norm(target_dir: Path) -> torch.Tensor:
    """The target's final norm weight ``[H]``, found by name in the checkpoint's weight index
    (``model.safetensors.index.json``) or its safetensors files (:func:`final_norm_key`).

    Raises:
        ModelError: no weight of the checkpoint is a final norm.
    """
    import json

    from safetensors import safe_open

    target_dir = Path(target_dir)
    index = target_dir / WEIGHTS_INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        key = final_norm_key(list(weight_map))
        if key is not None:
            with safe_open(str(target_dir / weight_map[key]), framework="pt") as st:
                return st.get_tensor(key)
    for f in sorted(target_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            key = final_norm_key(list(st.keys()))
            if key is not None:
                return st.get_tensor(key)
    raise ModelError(f"no final norm weight (model.norm.weight or a wrapped model's) in {target_dir}",
                     "check target.path points at the checkpoint folder (or set train.norm_init=ones for a target "
                     "whose final norm is named otherwise)")
