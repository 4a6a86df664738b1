"""Drafter families: one interface, one folder per family, picked by ``train.family``.

A family is what differs between drafters that share everything else (the run's data, features, checkpoints,
resume, metrics and progress line): how its model is built from the target, what its training objective computes
on the batches the trainer already produces, how it is exported for the engine and which speculative config the
engine serves it with. The trainer, ``draftsmith export`` and ``draftsmith eval`` ask :func:`get_family` and never
branch on a family's name.

Families are named by import path (:data:`REGISTRY`), so this module imports none of them (nor torch): a family
module is loaded when it is asked for, and one that this build does not hold is refused with the reason. Each
family's folder holds its ``model``, ``objective`` and ``export`` modules (the ones it does not borrow) and a
``family`` module defining ``FAMILY``, an object with the attributes and methods of :class:`Family`.

- ``eagle3`` (:mod:`.eagle3`): EAGLE-3, chain drafting, one token per drafter pass.
- ``peagle`` (:mod:`.peagle`): P-EAGLE, parallel drafting, K tokens from one drafter pass (K - 1 mask slots);
  EAGLE-3's objective and export.
- ``dflash`` (:mod:`.dflash`): DFlash, block diffusion over several target layers.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any, Protocol

from draftsmith.errors import ConfigError

FAMILIES = ("eagle3", "peagle", "dflash")
DEFAULT = "eagle3"
REGISTRY = {name: f"{__name__}.{name}.family" for name in FAMILIES}
# Key of an export's config.json naming the family that wrote it (engines ignore keys they do not read).
EXPORT_KEY = "draftsmith_family"


class Family(Protocol):
    """What a family module's ``FAMILY`` provides. Shapes: B batch, T tokens, H drafter width, N draft vocabulary.

    Attributes:
        name: the ``train.family`` value. method: vLLM's ``speculative_config.method``.
        layouts: export layouts it writes (``draftsmith.artifacts.export.LAYOUTS`` names or its own).
        chain_drafting: one draft token per drafter pass, so ``draftsmith eval --offline``'s greedy chain
            (``drafter/offline.py``) measures it; a family without it is refused there.
    """

    name: str
    method: str
    layouts: tuple[str, ...]
    chain_drafting: bool

    def check(self, settings: Any, features: Any) -> None:
        """Refuse, before anything is built or trained, a run this family cannot train or the configured engine
        cannot serve (``features`` is the trainer's :class:`~draftsmith.drafter.data.FeatureSource`).

        Raises:
            ConfigError or DataError: with the reason and the fix.
        """

    def build_model(self, cfg: Any, target_path: str) -> Any:
        """The drafter ``nn.Module`` for ``cfg`` (a :class:`~draftsmith.drafter.config.DraftConfig` derived from the
        target), before the trainer loads the target's embedding and head rows into it."""

    def objective(self, model: Any, tc: Any) -> Any:
        """An ``nn.Module`` whose ``forward(batch, view)`` returns ``(loss scalar, StepStats)`` on the trainer's
        batches (``input_ids``/``loss_mask`` ``[B, T]``, ``aux`` ``[B, T, n*H_t]``, ``lengths`` ``[B]``) and
        :class:`~draftsmith.drafter.ttt.TargetView`; ``StepStats`` holds one column per draft position, so the
        progress line, metrics and simulated acceptance length are shared."""

    def load_checkpoint(self, ckpt: Path, target_path: str) -> Any:
        """A training checkpoint of this family as its drafter, eval mode."""

    def export_checkpoint(
        self, ckpt: Path, target_path: str, out_root: Path, fmt: str, speculative_tokens: int
    ) -> list[Path]:
        """Write the checkpoint under ``out_root/<layout>/`` in the layouts ``fmt`` asks for that the family has.

        Raises:
            ModelError: ``fmt`` names only layouts this family cannot be served from.
        """

    def speculative_config(self, drafter: Path | str, k: int) -> dict[str, Any]:
        """vLLM's ``--speculative-config`` serving the export folder ``drafter`` with ``k`` draft tokens per step."""

    def check_engine(self, engine: str) -> None:
        """Refuse an engine (``vllm``, ``sglang``, ``both``) that cannot serve this family.

        Raises:
            ConfigError: with the reason.
        """


def refuse_unless_vllm(engine: str, label: str, how: str) -> None:
    """The ``check_engine`` of a family only vLLM serves here: ``label`` names the family in the message and
    ``how`` says how vLLM serves it (docs/families.md has the evidence per engine).

    Raises:
        ConfigError: ``engine`` is ``sglang`` or ``both``; the fix is ``eval.engine=vllm``.
    """
    if engine != "vllm":
        raise ConfigError(
            f"engine {engine!r} cannot serve {label}: draftsmith serves it in vLLM only ({how}, docs/families.md)",
            "set eval.engine=vllm",
        )


def get_family(name: str) -> Family:
    """The family registered as ``name`` (its module's ``FAMILY``).

    Raises:
        ConfigError: ``name`` is not a family, or this build does not hold its module.
    """
    if name not in REGISTRY:
        raise ConfigError(
            f"unknown drafter family {name!r}", f"set train.family to one of {', '.join(FAMILIES)}"
        )
    try:
        module = importlib.import_module(REGISTRY[name])
    except ModuleNotFoundError as e:
        if not _held_by(REGISTRY[name], e.name):
            raise
        raise ConfigError(
            f"drafter family {name!r} is not in this build ({REGISTRY[name]} is missing)",
            f"pick another train.family ({', '.join(available())}) or install a build that has it",
        ) from e
    return module.FAMILY


def usable_family(settings: Any, features: Any = None) -> Family:
    """``train.family`` of ``settings``, checked against the run before anything is built or trained
    (:meth:`Family.check`; ``features`` is the trainer's feature source).

    Raises:
        ConfigError or DataError: an unknown family, one this build does not hold, or one the run's target,
            features or engine cannot use; the message says why.
    """
    family = get_family(settings.train.family)
    family.check(settings, features)
    return family


def available() -> list[str]:
    """The registered families whose modules this build holds."""
    return [n for n in FAMILIES if _found(REGISTRY[n])]


def _held_by(path: str, missing: str | None) -> bool:
    """Whether the module ``missing`` that an import reported absent is ``path`` or a package on its way (the
    family's folder), rather than something the family's code imports."""
    return missing is not None and (path == missing or path.startswith(missing + "."))


def _found(path: str) -> bool:
    """Whether the module ``path`` exists in this build (its family folder and the module in it)."""
    try:
        return importlib.util.find_spec(path) is not None
    except ModuleNotFoundError as e:  # find_spec imports the parent packages; the family's folder is missing
        if not _held_by(path, e.name):
            raise
        return False


def family_of_state(state: dict[str, Any]) -> str:
    """The family a checkpoint's ``state.json`` was trained as (its recorded ``train.family``; a checkpoint from
    before families were recorded is EAGLE-3)."""
    return ((state.get("config") or {}).get("train") or {}).get("family") or DEFAULT


def family_of_export(config: dict[str, Any]) -> str:
    """The family of an export folder's ``config.json``: :data:`EXPORT_KEY` where draftsmith wrote it; else
    ``dflash`` for a ``dflash_config``, ``peagle`` for an EAGLE-3 config carrying a ``mask_token_id`` (a peer's
    P-EAGLE export), else ``eagle3``."""
    if config.get(EXPORT_KEY):
        return str(config[EXPORT_KEY])
    if "dflash_config" in config:
        return "dflash"
    return "peagle" if config.get("mask_token_id") is not None else DEFAULT


def require_family(found: str, wanted: str, what: str) -> None:
    """Refuse ``what`` (a checkpoint, an export) of family ``found`` where ``wanted`` is configured.

    Raises:
        ConfigError: the two differ.
    """
    if found != wanted:
        raise ConfigError(
            f"{what} is a {found!r} drafter, train.family is {wanted!r}",
            f"set train.family={found}, or train into a new run",
        )


def state_of_family(state: dict[str, Any], wanted: str, name: str) -> dict[str, Any]:
    """A checkpoint's ``state.json`` (``name`` its folder name) when it was trained as family ``wanted``.

    Raises:
        ConfigError: it was trained as another family (:func:`require_family`).
    """
    require_family(family_of_state(state), wanted, f"checkpoint {name}")
    return state
