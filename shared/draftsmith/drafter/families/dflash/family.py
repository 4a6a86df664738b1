"""DFlash as a family (:class:`~draftsmith.drafter.families.Family`): block diffusion drafting, one drafter pass
proposes a whole block (``model.py`` beside it), trained on anchored blocks (``objective.py``), exported in the
layout vLLM's ``qwen3_dflash.py`` loads (``export.py``) and served as ``method: dflash``.

Settings: the block is ``train.ttt_steps + 1`` slots (the anchor token and K = ``train.ttt_steps`` masks, the most
vLLM may serve it with), ``train.dflash_anchors`` blocks per sequence and pass, slot weights
``train.loss_decay ** (i - 1)``. The context layers are the run's extracted aux layers (``extract.layers``; vLLM's
``dflash_config.target_layer_ids`` are written from them): DFlash reads the same stored features as EAGLE-3, any
number of target layers would do for the model, the feature store holds three.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from draftsmith.artifacts.export import config_path
from draftsmith.artifacts.location import run_location
from draftsmith.drafter.checkpoint import load_model_weights, read_state
from draftsmith.drafter.config import DraftConfig, read_target_config
from draftsmith.drafter.families import refuse_unless_vllm
from draftsmith.drafter.families.dflash.export import load_dflash_export, write_dflash_export
from draftsmith.drafter.families.dflash.model import DFlashDrafter, default_mask_token_id
from draftsmith.drafter.families.dflash.objective import DFlashObjective
from draftsmith.drafter.vocab import init_from_target
from draftsmith.errors import ConfigError, ModelError
from draftsmith.log import get_logger

log = get_logger(__name__)

LAYOUT = "dflash"  # export/dflash/
PLACEHOLDER_BLOCK = (
    2  # block size of a drafter before its objective sets train.ttt_steps + 1 (no weight depends on it)
)
EAGLE3_ONLY = ("norm_before_residual", "fc_norm", "norm_before_fc", "norm_output")


class DFlashFamily:
    """DFlash: K = ``train.ttt_steps`` draft tokens from one non-causal pass over ``[anchor, K masks]``."""

    name = "dflash"
    method = "dflash"
    layouts = (LAYOUT,)
    chain_drafting = False  # a block per drafter pass: eval --offline's greedy chain cannot measure it

    def check(self, settings: Any, features: Any) -> None:
        """Refuse what a DFlash run cannot use, before anything is built: context layers other than the extracted
        ones, EAGLE-3's norm options, a pretrained EAGLE-3 drafter to start from, every-row loss, an engine other
        than vLLM and the speculators-only export format.

        Raises:
            ConfigError: with the reason and the fix.
        """
        tc = settings.train
        have = list(features.layer_ids) if features is not None else None
        if tc.layer_ids and have is not None and list(tc.layer_ids) != have:
            ids = ",".join(str(i) for i in tc.layer_ids)
            raise ConfigError(
                f"train.layer_ids {list(tc.layer_ids)} are not the extracted layers {have}: the DFlash context is "
                "read from the stored features",
                f"extract those layers (`draftsmith extract` with extract.layers={ids}), or drop train.layer_ids",
            )
        flags = [f for f in EAGLE3_ONLY if getattr(tc, f)]
        if flags:
            raise ConfigError(
                f"train.{flags[0]} is an EAGLE-3 option; a DFlash drafter has no such norm",
                f"unset train.{flags[0]} or set train.family=eagle3",
            )
        if tc.init_from:
            raise ConfigError(
                "train.init_from starts from an EAGLE-3 drafter; a DFlash drafter has other layers",
                "drop train.init_from for train.family=dflash",
            )
        if tc.loss_rows == "all":
            raise ConfigError(
                "train.loss_rows=all: DFlash blocks are anchored in the answers (loss-masked tokens)",
                "set train.loss_rows=generated",
            )
        if tc.num_layers > 1:
            log.warning(
                "a DFlash drafter of %d layers is served on vLLM's CPU build with layer 0's k_norm on every "
                "layer's context keys (docs/families.md, CPU caveat); 1 layer is served exactly",
                tc.num_layers,
            )
        self.check_engine(settings.eval.engine)
        if settings.export.format == "speculators":
            raise ConfigError(
                "DFlash is exported in its own layout (export/dflash), not speculators",
                "set export.format to both (the default) or eagle3; either writes export/dflash",
            )

    def build_model(self, cfg: DraftConfig, target_path: str) -> DFlashDrafter:
        """:class:`DFlashDrafter` of ``cfg`` with the target's mask token (the block size is set by
        :meth:`objective`: no weight depends on it)."""
        return DFlashDrafter(cfg, PLACEHOLDER_BLOCK, default_mask_token_id(read_target_config(target_path)))

    def objective(self, model: DFlashDrafter, tc: Any) -> DFlashObjective:
        """The block objective: block size ``ttt_steps + 1``, ``dflash_anchors`` blocks per row, slot weights
        ``loss_decay ** (i - 1)``, anchors drawn from ``seed``."""
        model.block_size = tc.ttt_steps + 1
        return DFlashObjective(model, tc.dflash_anchors, tc.loss_decay, tc.seed)

    def load_checkpoint(self, ckpt: Path, target_path: str) -> DFlashDrafter:
        """A DFlash training checkpoint as its drafter (shape and block size from its ``state.json``), eval mode.

        Raises:
            ModelError: unreadable checkpoint or weights that do not fit.
        """
        state = read_state(Path(ckpt))
        cfg = DraftConfig.from_dict(state["drafter"])
        block = int(((state.get("config") or {}).get("train") or {}).get("ttt_steps", 1)) + 1
        model = DFlashDrafter(cfg, block, default_mask_token_id(read_target_config(target_path)))
        init_from_target(
            model,
            target_path,
            torch.zeros(cfg.draft_vocab_size, dtype=torch.long),
            torch.zeros(cfg.vocab_size, dtype=torch.bool),
            lm_head="random",
        )  # the frozen embedding
        load_model_weights(model, Path(ckpt))
        return model.eval()

    def load_export(self, folder: Path, target_path: str) -> DFlashDrafter:
        """:func:`~draftsmith.drafter.families.dflash.export.load_dflash_export`."""
        return load_dflash_export(folder, target_path)

    def export_checkpoint(
        self, ckpt: Path, target_path: str, out_root: Path, fmt: str, speculative_tokens: int
    ) -> list[Path]:
        """``out_root/dflash/`` (:func:`~draftsmith.drafter.families.dflash.export.write_dflash_export`), whatever
        EAGLE-3 layout ``fmt`` names (those do not exist for DFlash).

        Raises:
            ModelError: ``fmt`` is ``speculators`` only.
        """
        if fmt == "speculators":
            raise ModelError("DFlash is exported in its own layout only", "export with --format both")
        model = self.load_checkpoint(ckpt, target_path)
        if speculative_tokens > model.block_size - 1:
            log.warning(
                "export.speculative_tokens %d is more than the %d masked slots this drafter was trained with",
                speculative_tokens,
                model.block_size - 1,
            )
        return [write_dflash_export(model, run_location(out_root) / LAYOUT)]

    def speculative_config(self, drafter: Path | str, k: int) -> dict[str, Any]:
        """``{"method": "dflash", "model": drafter, "num_speculative_tokens": k}``.

        Raises:
            ConfigError: ``k`` is more than the drafter's masked slots (``block_size - 1`` of its ``config.json``).
        """
        conf = json.loads(config_path(Path(drafter)).read_text())
        slots = int(conf.get("block_size", k + 1)) - 1
        if k > slots:
            raise ConfigError(
                f"K = {k} draft tokens asked of a DFlash drafter trained with {slots} masked slots",
                f"set eval.k <= {slots}, or train with train.ttt_steps={k}",
            )
        return {"method": self.method, "model": str(drafter), "num_speculative_tokens": k}

    def check_engine(self, engine: str) -> None:
        """Only vLLM is known to serve DFlash here (docs/families.md).

        Raises:
            ConfigError: ``engine`` is ``sglang`` or ``both``.
        """
        refuse_unless_vllm(engine, "DFlash", "method: dflash")


FAMILY = DFlashFamily()
