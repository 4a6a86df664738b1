"""P-EAGLE as a family (:class:`~draftsmith.drafter.families.Family`): the drafter of
:mod:`draftsmith.drafter.families.peagle.model`, trained with EAGLE-3's TTT objective (K = ``train.ttt_steps``
parallel positions per anchor), exported in the eagle3 layout with ``mask_hidden`` and ``mask_token_id``, served
by vLLM with ``parallel_drafting``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from draftsmith.artifacts.export import EAGLE3, SPECULATORS, config_path, layout_dir
from draftsmith.drafter.checkpoint import load_model_weights, read_state
from draftsmith.drafter.config import DraftConfig
from draftsmith.drafter.families import EXPORT_KEY, refuse_unless_vllm
from draftsmith.drafter.families.eagle3.export import write_export
from draftsmith.drafter.families.eagle3.objective import TTTObjective
from draftsmith.drafter.families.peagle.model import PEagleDrafter, mask_token_id
from draftsmith.drafter.vocab import init_from_target
from draftsmith.errors import ConfigError, ModelError
from draftsmith.log import get_logger
from draftsmith.target.checkpoint import target_checkpoint
from draftsmith.target.server import eagle3_config

log = get_logger(__name__)



class PEagleFamily:
    """P-EAGLE: ``train.ttt_steps`` = K draft tokens per drafter pass; served by vLLM with parallel drafting."""

    name = "peagle"
    method = "eagle3"
    layouts = (EAGLE3,)
    chain_drafting = False  # one token per drafter pass (the offline estimate's way)

    def check(self, settings: Any, features: Any) -> None:
        """Refuse K < 2 (that is EAGLE-3), an eval engine that cannot serve P-EAGLE, an export format this
        family cannot be written in and a pretrained drafter (``train.init_from``) that is not a P-EAGLE one.

        Raises:
            ConfigError: with the reason.
        """
        if settings.train.ttt_steps < 2:
            raise ConfigError(
                "train.family=peagle drafts K = train.ttt_steps tokens per pass; 1 is EAGLE-3",
                "set train.ttt_steps to the K you will serve (>= 2), or train.family=eagle3",
            )
        self.check_engine(settings.eval.engine)
        if settings.export.format == SPECULATORS:
            raise ConfigError(
                "P-EAGLE is exported in the eagle3 layout only (its mask_hidden and mask_token_id "
                "are read there by vLLM's llama_eagle3.py)",
                "set export.format to eagle3 or both",
            )
        if settings.train.init_from:
            self._check_init_from(Path(settings.train.init_from), mask_token_id(target_checkpoint(settings)))

    @staticmethod
    def _check_init_from(folder: Path, mask: int) -> None:
        """A pretrained drafter to fine-tune must be a P-EAGLE one with this run's mask token (its ``mask_hidden``
        was learned with that token's embedding row).

        Raises:
            ConfigError: it has no ``mask_token_id`` (an EAGLE-3 drafter) or another one.
        """
        cfg = config_path(folder)
        found = json.loads(cfg.read_text()).get("mask_token_id") if cfg.is_file() else None
        if found is None:
            raise ConfigError(
                f"train.init_from {folder} is not a P-EAGLE drafter (its config has no "
                "mask_token_id, its weights no mask_hidden)",
                "fine-tune from a P-EAGLE export, or train P-EAGLE from scratch (drop train.init_from)",
            )
        if int(found) != mask:
            raise ConfigError(
                f"train.init_from {folder} was trained with mask token {found}, this target's is {mask}",
                "fine-tune from a P-EAGLE drafter of this target",
            )

    def build_model(self, cfg: DraftConfig, target_path: str) -> PEagleDrafter:
        """:class:`PEagleDrafter` of ``cfg`` with the target's :func:`mask_token_id`."""
        return PEagleDrafter(cfg, mask_token_id(target_path))

    def objective(self, model: PEagleDrafter, tc: Any) -> TTTObjective:
        """The TTT objective over K = ``train.ttt_steps`` parallel slots (module docstring)."""
        return TTTObjective(
            model, tc.ttt_steps, tc.loss_decay, tc.loss_rows == "all", tc.feature_noise, tc.ttt_loss,
            tc.step_weights, tc.hard_row_gamma,
        )

    def load_checkpoint(self, ckpt: Path, target_path: str) -> PEagleDrafter:
        """A P-EAGLE training checkpoint as its drafter (config from its ``state.json``), eval mode.

        Raises:
            ModelError: unreadable checkpoint or weights that do not fit.
        """
        cfg = DraftConfig.from_dict(read_state(Path(ckpt))["drafter"])
        model = PEagleDrafter(cfg, mask_token_id(target_path))
        init_from_target(
            model,
            target_path,
            torch.zeros(cfg.draft_vocab_size, dtype=torch.long),
            torch.zeros(cfg.vocab_size, dtype=torch.bool),
            lm_head="random",
        )
        load_model_weights(model, Path(ckpt))
        return model.eval()

    def export_checkpoint(
        self, ckpt: Path, target_path: str, out_root: Path, fmt: str, speculative_tokens: int
    ) -> list[Path]:
        """``out_root/eagle3/``: the EAGLE-3 export plus ``mask_hidden`` in the weights and ``mask_token_id`` in
        ``config.json`` (what vLLM reads with parallel drafting on; docs/families.md).

        Raises:
            ModelError: ``fmt`` is ``speculators`` only.
        """
        if fmt == SPECULATORS:
            raise ModelError("P-EAGLE is exported in the eagle3 layout only", "export with --format eagle3")
        if fmt != EAGLE3:
            log.info("P-EAGLE: writing the eagle3 layout only (export.format=%s)", fmt)
        model = self.load_checkpoint(ckpt, target_path)
        extra = {"mask_token_id": model.mask_token_id, EXPORT_KEY: self.name}
        return [
            write_export(model, layout_dir(out_root, EAGLE3), EAGLE3, speculative_tokens, target_path, extra)
        ]

    def speculative_config(self, drafter: Path | str, k: int) -> dict[str, Any]:
        """EAGLE-3's config with ``parallel_drafting: true``."""
        return {**eagle3_config(drafter, k), "parallel_drafting": True}

    def check_engine(self, engine: str) -> None:
        """Only vLLM is known to serve P-EAGLE (docs/families.md).

        Raises:
            ConfigError: ``engine`` is ``sglang`` or ``both``.
        """
        refuse_unless_vllm(engine, "P-EAGLE", "speculative_config.parallel_drafting")


FAMILY = PEagleFamily()
