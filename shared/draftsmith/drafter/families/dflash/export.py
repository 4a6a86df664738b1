"""Export a DFlash drafter in the layout vLLM's ``qwen3_dflash.py`` loads, and read one back.

``config.json``: ``architectures: [DFlashDraftModel]`` (vLLM's registry maps it to
``qwen3_dflash.DFlashQwen3ForCausalLM``; ``config/speculative.py`` also infers ``method: dflash`` from the name),
``model_type: qwen3`` with the target's widths, heads and RoPE, ``num_hidden_layers``, ``block_size``, and
``dflash_config: {target_layer_ids, mask_token_id}``. ``target_layer_ids`` are read by the same
``get_eagle3_aux_layers_from_config`` as EAGLE-3's aux ids, so they are written in vLLM's numbering (our output of
layer ``i`` is vLLM's ``i + 1``: :func:`draftsmith.features.layers.vllm_aux_ids`). No ``causal`` / ``layer_types``:
every layer non-causal, as trained.

``model.safetensors``: the drafter's state dict without ``embed_tokens`` (vLLM shares the target's), names as vLLM's
loader takes them (it prefixes ``model.`` and stacks ``q/k/v_proj`` -> ``qkv_proj``, ``gate/up_proj`` ->
``gate_up_proj``); ``lm_head.weight`` ``[N, H]`` over the draft vocabulary (vLLM then keeps the drafter's own head:
``process_eagle_weight``) and ``d2t`` (read as ``draft_id_to_target_id``; ``t2d`` is skipped by the loader). No ``mask_hidden`` (the loader asserts its
absence: DFlash embeds the mask token). Written under a temporary name and renamed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from draftsmith.artifacts.export import config_path, weights_path
from draftsmith.artifacts.provenance import stamp
from draftsmith.drafter.checkpoint import model_state
from draftsmith.drafter.config import DraftConfig, decoder_fields
from draftsmith.drafter.families import EXPORT_KEY
from draftsmith.drafter.families.dflash.model import DFlashDrafter
from draftsmith.drafter.vocab import load_target_head
from draftsmith.errors import ModelError
from draftsmith.features.layers import vllm_aux_ids
from draftsmith.log import get_logger

log = get_logger(__name__)

ARCHITECTURE = "DFlashDraftModel"
DRAFTER_KEY = "draftsmith_drafter"  # the drafter's DraftConfig, to read the export back


def dflash_config_json(model: DFlashDrafter) -> dict[str, Any]:
    """The export's ``config.json`` (see the module docstring)."""
    cfg = model.cfg
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "qwen3",
        **decoder_fields(cfg),
        "draft_vocab_size": cfg.draft_vocab_size,
        "rope_parameters": dict(cfg.rope_parameters),
        "target_hidden_size": cfg.target_hidden_size,
        "num_target_layers": cfg.target_num_layers,
        "block_size": model.block_size,
        "dflash_config": {
            "target_layer_ids": vllm_aux_ids(cfg.layer_ids),
            "mask_token_id": model.mask_token_id,
        },
        EXPORT_KEY: "dflash",
        DRAFTER_KEY: cfg.to_dict(),
    }


def export_weights(model: DFlashDrafter) -> dict[str, torch.Tensor]:
    """``{name: tensor}`` of everything vLLM loads: :func:`~draftsmith.drafter.checkpoint.model_state` (no
    ``embed_tokens``, no rotary tables), float32; ``d2t``/``t2d`` only for a draft vocabulary smaller than the
    target's (vLLM has no ``draft_id_to_target_id`` to load them into otherwise)."""
    whole = model.cfg.draft_vocab_size == model.cfg.vocab_size
    return {
        k: (v.float() if v.is_floating_point() else v).contiguous()
        for k, v in model_state(model).items()
        if not (whole and k in ("d2t", "t2d"))
    }


def write_dflash_export(model: DFlashDrafter, out_dir: Path) -> Path:
    """Write ``config.json`` + ``model.safetensors`` into ``out_dir`` atomically; returns ``out_dir``."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".tmp-{out_dir.name}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    config_path(tmp).write_text(json.dumps(stamp(dflash_config_json(model)), indent=2))
    save_file(export_weights(model), str(weights_path(tmp)), metadata={"format": "pt"})
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    log.info("exported the DFlash drafter to %s", out_dir)
    return out_dir


def load_dflash_export(folder: Path, target_path: Path | str) -> DFlashDrafter:
    """A drafter from an export written by :func:`write_dflash_export`, with the target's embedding, eval mode.

    Raises:
        ModelError: not a DFlash export of draftsmith, or weights that do not fit its config.
    """
    from safetensors.torch import load_file

    conf = json.loads(config_path(folder).read_text())
    if conf.get("architectures") != [ARCHITECTURE] or DRAFTER_KEY not in conf:
        raise ModelError(f"{folder} is not a DFlash export written by draftsmith", "export the run again")
    model = DFlashDrafter(
        DraftConfig.from_dict(conf[DRAFTER_KEY]),
        int(conf["block_size"]),
        int(conf["dflash_config"]["mask_token_id"]),
    )
    if model.cfg.draft_vocab_size == model.cfg.vocab_size:
        model.d2t.zero_()
        model.t2d.fill_(True)
    missing, unexpected = model.load_state_dict(load_file(str(weights_path(folder))), strict=False)
    allowed = {"embed_tokens.weight", "d2t", "t2d"}
    if unexpected or set(missing) - allowed:
        raise ModelError(
            f"{folder}: weights do not fit the config (missing {sorted(set(missing) - allowed)}, "
            f"unexpected {sorted(unexpected)})",
            "export the run again",
        )
    with torch.no_grad():
        model.embed_tokens.weight.copy_(load_target_head(target_path)[0])
    return model.eval()
