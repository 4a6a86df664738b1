"""The target checkpoint folder and its ``config.json``: the one place every stage resolves them.

The folder is ``target.path`` when set (any Hugging Face checkpoint folder: ``config.json``, tokenizer, weights),
else the embedded default, SmolLM2-135M-Instruct under ``target.cache_dir`` (``draftsmith target prepare`` builds
it; see :mod:`draftsmith.target.embedded`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftsmith.errors import ModelError

if TYPE_CHECKING:
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
    from draftsmith.target.embedded import embedded_dir, is_prepared, prepare_embedded

    if s.target.path:
        p = Path(s.target.path).expanduser()
        if not (p / "config.json").is_file():
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


def read_target_config(folder: Path | str, text: bool = False) -> dict[str, Any]:
    """The target's ``config.json``, read without loading weights.

    Args:
        folder: the checkpoint folder.
        text: return the language model's part (``text_config`` of a multimodal config, else the whole config).

    Raises:
        ModelError: no readable ``config.json`` in ``folder``.
    """
    f = Path(folder) / "config.json"
    if not f.is_file():
        raise ModelError(f"{f} does not exist", "point target.path at a Hugging Face checkpoint folder")
    try:
        cfg = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot read the target config {f}: {e}", "set target.path to a checkpoint folder") from e
    return cfg.get("text_config", cfg) if text else cfg
