"""Export a trained drafter in the two layouts serving engines load (``docs/formats.md``).

1. ``eagle3`` (EAGLE / SpecForge; SGLang and vLLM): ``LlamaForCausalLMEagle3`` config with every engine-read field
   copied from the target and ``eagle_config``; weights ``fc.weight``, ``midlayer.*``, ``norm.weight``,
   ``lm_head.weight``, ``d2t``, ``t2d``.
2. ``speculators`` (vLLM): ``speculators_model_type: eagle3`` with ``transformer_layer_config`` and
   ``speculators_config``; weights ``layers.0.*`` instead of ``midlayer.*``. ``norm_before_residual`` is always
   written: vLLM's speculators reader defaults it to true when missing (``configs/speculators/algos.py``), its
   EAGLE reader to false (``llama_eagle3.py``), and the drafter must be served the way it was trained.

Both layouts write ``fc_norm``, ``norm_before_fc`` and ``norm_output`` top-level, where vLLM 0.32 reads them in
either layout (its speculators reader copies them; ``llama_eagle3.py`` also accepts ``norm_before_fc`` inside
``eagle_config``), and ``norm_before_fc``'s weight is ``input_norm.weight``, the name vLLM loads (it drops that
weight when the flag is false, so flag and weight must travel together).

Aux layer ids are written in vLLM's numbering (our output-of-layer ``i`` is vLLM's ``i + 1``; current SGLang reads
the same ids as the same tensors unless the first is 1, so the ``eagle3`` layout, which SGLang loads, refuses a first
layer 0: see ``draftsmith.features.layers``). Neither layout stores ``embed_tokens``: the drafter's embedding is the target's, frozen, which vLLM then shares.
Folders are written under a temporary name and renamed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from draftsmith.artifacts.export import (
    EAGLE3,
    EAGLE3_ARCHITECTURE,
    SPECULATORS,
    check_layout,
    config_path,
    layout_dir,
    weights_path,
)
from draftsmith.artifacts.provenance import stamp
from draftsmith.drafter.checkpoint import FROZEN, model_state
from draftsmith.drafter.config import DraftConfig, decoder_fields, vllm_layer_ids
from draftsmith.drafter.load import load_checkpoint_model
from draftsmith.features.layers import eagle3_layout_ids
from draftsmith.log import get_logger

log = get_logger(__name__)

SPECULATORS_VERSION = "0.3.0"


def llama_fields(cfg: DraftConfig) -> dict[str, Any]:
    """The decoder's Llama config fields, copied from the target (vocab_size = target vocabulary)."""
    rope = dict(cfg.rope_parameters)
    legacy_scaling = {k: v for k, v in rope.items() if k not in ("rope_theta",)}
    return {
        "model_type": "llama",
        **decoder_fields(cfg),
        "mlp_bias": cfg.mlp_bias,
        "rope_theta": rope.get("rope_theta", 10000.0),
        "rope_scaling": legacy_scaling if legacy_scaling.get("rope_type", "default") != "default" else None,
        "rope_parameters": rope,
    }


def eagle3_config(cfg: DraftConfig) -> dict[str, Any]:
    """``config.json`` of the EAGLE / SpecForge layout."""
    return {
        "architectures": [EAGLE3_ARCHITECTURE],
        **llama_fields(cfg),
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "norm_before_residual": cfg.norm_before_residual,
        "fc_norm": cfg.fc_norm,
        "norm_before_fc": cfg.norm_before_fc,
        "norm_output": cfg.norm_output,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": eagle3_layout_ids(cfg.layer_ids),
                         "use_aux_hidden_state": True},
    }


def speculators_config(cfg: DraftConfig, speculative_tokens: int, verifier: str) -> dict[str, Any]:
    """``config.json`` of the speculators layout (``speculators_model_type: eagle3``)."""
    layer = {"architectures": ["LlamaForCausalLM"], **llama_fields(cfg)}
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": EAGLE3,
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": layer,
        "draft_vocab_size": cfg.draft_vocab_size,
        "norm_before_residual": cfg.norm_before_residual,
        "fc_norm": cfg.fc_norm,
        "norm_before_fc": cfg.norm_before_fc,
        "norm_output": cfg.norm_output,
        "target_hidden_size": cfg.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": vllm_layer_ids(cfg.layer_ids),
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": list(cfg.target_architectures)},
        },
        "torch_dtype": "float32",
    }


def export_weights(model, layout: str) -> dict[str, torch.Tensor]:
    """Weight dict in ``layout`` (``eagle3``: ``layers.0.`` -> ``midlayer.``; ``speculators``: unchanged)."""
    out = {}
    for k, v in model_state(model).items():
        if k in FROZEN:
            continue
        if layout == EAGLE3 and k.startswith("layers.0."):
            k = "midlayer." + k[len("layers.0."):]
        out[k] = v.contiguous()
    return out


def write_export(model, out_dir: Path, layout: str, speculative_tokens: int = 3, verifier: str = "",
                 extra_config: dict[str, Any] | None = None) -> Path:
    """Write one layout into ``out_dir`` (``config.json`` + ``model.safetensors``) atomically; the config records
    the ``code_version`` that wrote it (:func:`draftsmith.artifacts.provenance.stamp`, read back by ``eval``).

    Args:
        model: trained :class:`~draftsmith.drafter.families.eagle3.model.Eagle3Drafter`.
        layout: ``eagle3`` or ``speculators``.
        speculative_tokens: default K written into the speculators config.
        verifier: the target's path or name (speculators ``verifier.name_or_path``).
        extra_config: keys added to ``config.json`` (a family's own, e.g. P-EAGLE's ``mask_token_id``).
    """
    from safetensors.torch import save_file

    cfg: DraftConfig = model.cfg
    check_layout(layout)
    config = stamp(eagle3_config(cfg) if layout == EAGLE3 else speculators_config(cfg, speculative_tokens, verifier))
    config.update(extra_config or {})
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".tmp-{out_dir.name}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    config_path(tmp).write_text(json.dumps(config, indent=2))
    save_file(export_weights(model, layout), str(weights_path(tmp)), metadata={"format": "pt"})
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    log.info("exported %s layout to %s", layout, out_dir)
    return out_dir


def export_checkpoint(ckpt: Path, target_path: str, out_root: Path, fmt: str, speculative_tokens: int = 3) -> list[Path]:
    """Export checkpoint ``ckpt`` to ``out_root/<layout>/`` for ``fmt`` in eagle3 | speculators | both."""
    model = load_checkpoint_model(ckpt, target_path)
    layouts = [SPECULATORS, EAGLE3] if fmt == "both" else [fmt]  # eagle3 last: it may refuse the layer ids
    return [write_export(model, layout_dir(out_root, lay), lay, speculative_tokens, target_path) for lay in layouts]
