"""Drafter exports under ``runs/<run>/export/`` (docs/formats.md §6): the two layouts engines load, and their files.

Layout folders: ``export/eagle3/`` (EAGLE / SpecForge: SGLang and vLLM) and ``export/speculators/`` (vLLM), each
holding ``config.json`` and ``model.safetensors`` (Hugging Face's own file names, taken from ``transformers``).
Which layout a folder holds is read from its config (:func:`layout_of`). Writer: :mod:`draftsmith.drafter.families.eagle3.export`;
readers: :mod:`draftsmith.drafter.load` (weights back into a drafter) and :mod:`draftsmith.evaluation.checks`
(shapes against the target, before any engine starts).
"""

from __future__ import annotations

from pathlib import Path

from draftsmith.artifacts.location import run_location
from draftsmith.errors import ModelError

# Hugging Face's names (transformers.utils.CONFIG_NAME / SAFE_WEIGHTS_NAME), spelled here so that reading them
# costs no transformers import; tests/test_artifacts_owners.py checks they still agree.
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"  # a sharded checkpoint's weight map (SAFE_WEIGHTS_INDEX_NAME)
EAGLE3 = "eagle3"
SPECULATORS = "speculators"
LAYOUTS = (EAGLE3, SPECULATORS)
EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"
DFLASH = "dflash"  # export/dflash/: a DFlash drafter (drafter/families/dflash/export.py), a family's own layout


def check_layout(layout: str) -> str:
    """``layout`` itself when it is one of :data:`LAYOUTS`.

    Raises:
        ValueError: any other name.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown export layout {layout!r}; expected one of {LAYOUTS}")
    return layout


def layout_dir(export_root: Path, layout: str) -> Path:
    """``export/<layout>/``.

    Raises:
        ValueError: ``layout`` is not one of :data:`LAYOUTS`.
    """
    return run_location(export_root) / check_layout(layout)


def config_path(folder: Path) -> Path:
    """An export folder's ``config.json``."""
    return run_location(folder) / CONFIG_FILE


def weights_path(folder: Path) -> Path:
    """An export folder's ``model.safetensors``."""
    return run_location(folder) / WEIGHTS_FILE


def layout_of(config: dict) -> str | None:
    """The layout an export's config describes: ``speculators`` (``speculators_model_type: eagle3``), ``eagle3``
    (architecture ``LlamaForCausalLMEagle3`` or an ``eagle_config``), ``dflash`` (a ``dflash_config``), or None for
    anything else."""
    if config.get("speculators_model_type") == EAGLE3:
        return SPECULATORS
    if EAGLE3_ARCHITECTURE in (config.get("architectures") or []) or "eagle_config" in config:
        return EAGLE3
    if "dflash_config" in config:
        return DFLASH
    return None


def require_layout(folder: Path, config: dict) -> str:
    """:func:`layout_of` a drafter folder's config, or one line saying what the folder holds instead.

    Raises:
        ModelError: the config describes neither layout; the message names the folder, its ``architectures``,
            ``model_type`` and ``speculators_model_type``, and the fix.
    """
    layout = layout_of(config)
    if layout is None:
        found = {k: config.get(k) for k in ("architectures", "model_type", "speculators_model_type")}
        raise ModelError(
            f"{folder} is not an EAGLE-3 drafter in either layout (its {CONFIG_FILE} has {found}; expected "
            f"architectures [{EAGLE3_ARCHITECTURE!r}] or an eagle_config, or speculators_model_type {EAGLE3!r})",
            "pass a folder written by `draftsmith export` (export/eagle3 or export/speculators), or an EAGLE-3 "
            "drafter trained by EAGLE, SpecForge or speculators",
        )
    return layout


def layer_fields(config: dict, layout: str) -> dict:
    """The decoder's Llama fields of an export's config: ``transformer_layer_config`` in the speculators layout,
    the config itself in the eagle3 one."""
    return config.get("transformer_layer_config") or {} if layout == SPECULATORS else config


def aux_layer_ids(config: dict) -> list[int] | None:
    """``eagle_aux_hidden_state_layer_ids`` (vLLM's numbering) where vLLM 0.32 looks for them: top-level first
    (the speculators layout), then ``eagle_config``, then a DFlash drafter's ``dflash_config.target_layer_ids`` (read
    by the same ``get_eagle3_aux_layers_from_config``); None when none has them (vLLM then uses its default)."""
    ids = config.get("eagle_aux_hidden_state_layer_ids") or (config.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids") or (config.get("dflash_config") or {}).get("target_layer_ids")
    return [int(i) for i in ids] if ids else None


def norm_flags(config: dict, layout: str) -> dict[str, bool]:
    """The drafter's norm options as vLLM 0.32 reads them from either layout.

    ``norm_before_residual`` defaults to true in the speculators layout (vLLM's ``configs/speculators/algos.py``)
    and to false in the eagle3 one (``llama_eagle3.py``); ``norm_before_fc`` is read from ``eagle_config`` before
    the top level; ``fc_norm`` and ``norm_output`` default to false.
    """
    eagle = config.get("eagle_config") or {}
    return {
        "norm_before_residual": bool(config.get("norm_before_residual", layout == SPECULATORS)),
        "fc_norm": bool(config.get("fc_norm", False)),
        "norm_before_fc": bool(eagle.get("norm_before_fc", config.get("norm_before_fc", False))),
        "norm_output": bool(config.get("norm_output", False)),
    }


def internal_name(key: str) -> str:
    """A drafter weight's name in :class:`~draftsmith.drafter.families.eagle3.model.Eagle3Drafter`: a ``model.`` prefix dropped and
    the eagle3 layout's ``midlayer.`` read as ``layers.0.`` (vLLM's mapping)."""
    key = key.removeprefix("model.")
    return "layers.0." + key[len("midlayer."):] if key.startswith("midlayer.") else key
