"""Drafter exports under ``runs/<run>/export/`` (docs/formats.md §6): the two layouts engines load, and their files.

Layout folders: ``export/eagle3/`` (EAGLE / SpecForge: SGLang and vLLM) and ``export/speculators/`` (vLLM), each
holding ``config.json`` and ``model.safetensors`` (Hugging Face's own file names, taken from ``transformers``).
Which layout a folder holds is read from its config (:func:`layout_of`). Writer: :mod:`draftsmith.drafter.export`;
readers: :mod:`draftsmith.drafter.load` (weights back into a drafter) and :mod:`draftsmith.evaluation.checks`
(shapes against the target, before any engine starts).
"""

from __future__ import annotations

from pathlib import Path

# Hugging Face's names (transformers.utils.CONFIG_NAME / SAFE_WEIGHTS_NAME), spelled here so that reading them
# costs no transformers import; tests/test_artifacts_owners.py checks they still agree.
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
EAGLE3 = "eagle3"
SPECULATORS = "speculators"
LAYOUTS = (EAGLE3, SPECULATORS)
EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"


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
    return Path(export_root) / check_layout(layout)


def config_path(folder: Path) -> Path:
    """An export folder's ``config.json``."""
    return Path(folder) / CONFIG_FILE


def weights_path(folder: Path) -> Path:
    """An export folder's ``model.safetensors``."""
    return Path(folder) / WEIGHTS_FILE


def layout_of(config: dict) -> str | None:
    """The layout an export's config describes: ``speculators`` (``speculators_model_type: eagle3``), ``eagle3``
    (architecture ``LlamaForCausalLMEagle3`` or an ``eagle_config``), or None for anything else."""
    if config.get("speculators_model_type") == EAGLE3:
        return SPECULATORS
    if EAGLE3_ARCHITECTURE in (config.get("architectures") or []) or "eagle_config" in config:
        return EAGLE3
    return None
