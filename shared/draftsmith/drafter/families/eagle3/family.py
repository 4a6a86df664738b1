"""EAGLE-3 as a family (:class:`~draftsmith.drafter.families.Family`): the chain drafter of ``model.py`` beside
it, trained with the training-time test of ``drafter/ttt.py`` (``objective.py``), exported by ``export.py`` in both
layouts and served as vLLM's ``method: eagle3`` (and by SGLang from the eagle3 layout)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from draftsmith.artifacts.export import EAGLE3, LAYOUTS
from draftsmith.drafter.config import DraftConfig
from draftsmith.drafter.families.eagle3.export import export_checkpoint
from draftsmith.drafter.families.eagle3.model import Eagle3Drafter
from draftsmith.drafter.families.eagle3.objective import TTTObjective
from draftsmith.drafter.load import load_checkpoint_model
from draftsmith.target.server import eagle3_config


class Eagle3Family:
    """EAGLE-3: one draft token per drafter pass, ``train.ttt_steps`` passes unrolled in training (chain)."""

    name = "eagle3"
    method = "eagle3"
    layouts = LAYOUTS
    chain_drafting = True  # one token per drafter pass (the offline estimate's way)

    def check(self, settings: Any, features: Any) -> None:
        """Nothing beyond what the trainer checks itself (features, vocabulary, target)."""

    def build_model(self, cfg: DraftConfig, target_path: str) -> Eagle3Drafter:
        """:class:`Eagle3Drafter` of ``cfg``."""
        return Eagle3Drafter(cfg)

    def objective(self, model: Eagle3Drafter, tc: Any) -> TTTObjective:
        """The TTT objective (``k = train.ttt_steps``, step weights ``train.loss_decay ** j`` or ``train.step_weights``)."""
        return TTTObjective(
            model, tc.ttt_steps, tc.loss_decay, tc.loss_rows == "all", tc.feature_noise, tc.ttt_loss,
            tc.step_weights, tc.hard_row_gamma,
        )

    def load_checkpoint(self, ckpt: Path, target_path: str) -> Eagle3Drafter:
        """:func:`~draftsmith.drafter.load.load_checkpoint_model`."""
        return load_checkpoint_model(ckpt, target_path)

    def export_checkpoint(
        self, ckpt: Path, target_path: str, out_root: Path, fmt: str, speculative_tokens: int
    ) -> list[Path]:
        """:func:`~draftsmith.drafter.families.eagle3.export.export_checkpoint` (``eagle3``, ``speculators`` or
        ``both``)."""
        return export_checkpoint(ckpt, target_path, out_root, fmt, speculative_tokens)

    def speculative_config(self, drafter: Path | str, k: int) -> dict[str, Any]:
        """``{"method": "eagle3", "model": drafter, "num_speculative_tokens": k}``."""
        return eagle3_config(drafter, k)

    def check_engine(self, engine: str) -> None:
        """vLLM and SGLang both serve EAGLE-3 (SGLang from the eagle3 layout, checked with the export)."""


FAMILY = Eagle3Family()
EXPORT_LAYOUT = EAGLE3
