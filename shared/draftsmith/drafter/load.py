"""Load drafters strictly: training checkpoints, and exported / pretrained drafters in either layout.

A converted checkpoint that lost the ``midlayer.`` -> ``layers.0.`` rename served with zero acceptance and only a
warning (speculators #358, #1114); here every missing or unexpected weight, a shape, hidden-size or vocabulary
mismatch, and a draft vocabulary other than the data's that shares too few tokens to remap raises
:class:`ModelError`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from draftsmith.artifacts.export import (
    aux_layer_ids,
    config_path,
    internal_name,
    layer_fields,
    norm_flags,
    require_layout,
)
from draftsmith.drafter.checkpoint import load_model_weights, model_state, read_state
from draftsmith.drafter.config import (
    DraftConfig,
    derive_config,
    from_vllm_layer_ids,
    read_target_config,
    rope_of,
    same_rope,
)
from draftsmith.drafter.families.eagle3.model import Eagle3Drafter
from draftsmith.drafter.vocab import init_from_target
from draftsmith.errors import ModelError
from draftsmith.log import get_logger

log = get_logger(__name__)

IGNORED = ("embed_tokens.weight",)  # a drafter's own copy of the target embedding: ours is the target's

# Fields of a drafter's config that change what it computes. A pretrained drafter must agree on each with the
# drafter a run builds from its target: the shapes would fail at load anyway (with a worse message), but the norm
# epsilon, the activation and the rotary settings would be replaced without a word (a public Kimi-K2.5 drafter
# rotates with theta 1e6 and no scaling, its target with theta 50000 and yarn).
COMPARED_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                   "hidden_act", "rms_norm_eps", "attention_bias", "mlp_bias", "vocab_size", "target_hidden_size")
ROPE_CHOICES = ("refuse", "drafter", "target")


def read_export(folder: Path | str) -> tuple[str, dict, dict[str, torch.Tensor]]:
    """Read an exported drafter folder.

    Returns:
        ``(layout, config dict, weights with internal names)``; layout is ``eagle3`` or ``speculators``.

    Raises:
        ModelError: no config/weights, an unknown layout, or an unreadable weights file.
    """
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg_path = config_path(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not cfg_path.is_file() or not files:
        raise ModelError(f"{folder} has no {cfg_path.name} or *.safetensors", "point at an exported drafter folder")
    config = json.loads(cfg_path.read_text())
    layout = require_layout(folder, config)
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            weights.update(load_file(str(f)))
        except Exception as e:  # safetensors raises its own types for corrupt files
            raise ModelError(f"cannot read {f}: {e}", "the drafter file is corrupt") from e
    return layout, config, {internal_name(k): v for k, v in weights.items()}


def vocab_maps(config: dict, weights: dict[str, torch.Tensor], vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d2t [N] int64, t2d [V] bool)`` of an export, filled in the way vLLM 0.32 serves it when missing.

    vLLM never reads ``t2d`` and, without ``d2t``, serves draft id i as target id i (``llama_eagle3.load_weights``);
    speculators writes neither for a draft vocabulary as large as the target's. So a missing ``d2t`` is zeros and a
    missing ``t2d`` is derived from ``d2t`` (``t2d[i + d2t[i]] = True``).

    Raises:
        ModelError: a ``t2d`` that disagrees with ``d2t`` (another mapping than the one served).
    """
    n = int(config.get("draft_vocab_size") or vocab_size)
    d2t = weights["d2t"].long() if "d2t" in weights else torch.zeros(n, dtype=torch.long)
    derived = torch.zeros(vocab_size, dtype=torch.bool)
    targets = torch.arange(d2t.numel()) + d2t
    if d2t.numel() and (int(targets.min()) < 0 or int(targets.max()) >= vocab_size):
        raise ModelError(f"d2t maps draft tokens outside the target vocabulary of {vocab_size}",
                         "the drafter was built for another target")
    derived[targets] = True
    if "t2d" not in weights:
        return d2t, derived
    t2d = weights["t2d"].bool()
    if t2d.shape == derived.shape and not torch.equal(t2d, derived):
        raise ModelError("the drafter's t2d and d2t name different draft vocabularies", "re-export the drafter")
    return d2t, t2d


def read_export_config(folder: Path | str) -> tuple[str, dict]:
    """``(layout, config dict)`` of an exported drafter folder, without its weights.

    Raises:
        ModelError: no ``config.json``, or a config of neither layout.
    """
    path = config_path(Path(folder))
    if not path.is_file():
        raise ModelError(f"{folder} has no {path.name}", "point at an exported drafter folder")
    config = json.loads(path.read_text())
    return require_layout(Path(folder), config), config


def pretrained_differences(config: dict, layout: str, cfg: DraftConfig) -> dict[str, tuple]:
    """Fields of :data:`COMPARED_FIELDS` and the rotary settings (key ``rope``) on which an exported drafter's
    config differs from ``cfg``: ``{field: (the export's value, cfg's value)}``; a field the export omits is not
    compared."""
    layer = layer_fields(config, layout)
    out: dict[str, tuple] = {}
    for key in COMPARED_FIELDS:
        theirs = config.get(key) if key == "target_hidden_size" else layer.get(key)
        ours = getattr(cfg, key)
        if theirs is None:
            continue
        numeric = isinstance(ours, int | float) and not isinstance(ours, bool)
        if (float(theirs) != float(ours)) if numeric else (theirs != ours):
            out[key] = (theirs, ours)
    if any(k in layer for k in ("rope_parameters", "rope_theta", "rope_scaling")):
        rope = rope_of(layer)
        if not same_rope(rope, cfg.rope_parameters):
            out["rope"] = (rope, dict(cfg.rope_parameters))
    return out


def fit_to_pretrained(cfg: DraftConfig, folder: Path | str, rope: str = "refuse") -> DraftConfig:
    """The drafter config a run fine-tunes from the pretrained drafter at ``folder``: ``cfg`` (derived from the
    target) once every field that changes the computation agrees.

    Args:
        cfg: the config derived from the target (:func:`~draftsmith.drafter.config.derive_config`).
        folder: exported drafter, either layout.
        rope: what to do when only the rotary settings differ: ``refuse`` (an error), ``drafter`` (keep the
            pretrained drafter's, which its weights were trained with; the export then carries them and the engines
            rotate the drafter with them), ``target`` (take the target's and let fine-tuning adapt). Logged.

    Raises:
        ModelError: a field differs (one line per field, with both values and the fix).
    """
    if rope not in ROPE_CHOICES:
        raise ModelError(f"train.init_rope={rope!r} is not one of {ROPE_CHOICES}")
    layout, config = read_export_config(folder)
    diff = pretrained_differences(config, layout, cfg)
    if "rope" in diff and rope != "refuse":
        theirs, ours = diff.pop("rope")
        if rope == "drafter":
            from dataclasses import replace

            cfg = replace(cfg, rope_parameters=dict(theirs))
        log.warning("pretrained drafter at %s rotates with %s, the target with %s: keeping the %s's (train.init_rope"
                    "=%s)", folder, theirs, ours, rope, rope)
    if diff:
        lines = "; ".join(f"{k}: {a} in the pretrained drafter, {b} in this run's" for k, (a, b) in diff.items())
        fix = ("rope only: set train.init_rope=drafter to keep the pretrained drafter's rotary settings (its weights "
               "were trained with them) or train.init_rope=target to fine-tune it to the target's"
               if set(diff) == {"rope"} else
               "the pretrained drafter was built for another target or with other settings; pick one for this "
               "target" + (" (and set train.init_rope for the rotary settings)" if "rope" in diff else ""))
        raise ModelError(f"pretrained drafter at {folder} does not match the drafter this run builds: {lines}", fix)
    return cfg


def export_draft_config(layout: str, config: dict, target_path: Path | str) -> DraftConfig:
    """Drafter config of an export, re-derived from the target and checked against the export's fields.

    Raises:
        ModelError: a field the engine reads differs from the target's, or both ``norm_before_fc`` and ``fc_norm``.
    """
    layer = layer_fields(config, layout)
    ids = aux_layer_ids(config)
    ids = from_vllm_layer_ids(ids) if ids else None
    n_draft = int(config.get("draft_vocab_size") or layer.get("vocab_size") or read_target_config(target_path).get(
        "vocab_size"))
    cfg = derive_config(target_path, n_draft, ids, int(layer.get("num_hidden_layers", 1)), **norm_flags(config, layout))
    for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size"):
        if key in layer and int(layer[key]) != int(getattr(cfg, key)):
            raise ModelError(f"drafter {key}={layer[key]} but the target has {getattr(cfg, key)}",
                             "this drafter was trained for another target")
    if any(k in layer for k in ("rope_parameters", "rope_theta", "rope_scaling")):
        from dataclasses import replace

        cfg = replace(cfg, rope_parameters=rope_of(layer))  # the engines rotate a drafter with its own settings
    return cfg


def check_weights(model, weights: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
    """Strict key and shape check against ``model``; returns the weights to load.

    Raises:
        ModelError: missing or unexpected weights, or a shape mismatch.
    """
    want = model_state(model)
    got = {k: v for k, v in weights.items() if k not in IGNORED}
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    bad = [f"{k} {tuple(got[k].shape)} != {tuple(want[k].shape)}" for k in want
           if k in got and tuple(got[k].shape) != tuple(want[k].shape)]
    if missing or extra or bad:
        raise ModelError(f"drafter at {where} does not fit: missing {missing[:5]}, unexpected {extra[:5]}, "
                         f"shape mismatch {bad[:3]}", "it comes from another architecture, target or converter")
    return got


def load_export_model(folder: Path | str, target_path: Path | str) -> Eagle3Drafter:
    """An exported drafter (either layout) as an :class:`Eagle3Drafter` with the target's embedding, eval mode."""
    layout, config, weights = read_export(folder)
    cfg = export_draft_config(layout, config, target_path)
    model = Eagle3Drafter(cfg)
    d2t, t2d = vocab_maps(config, weights, cfg.vocab_size)
    got = check_weights(model, {**weights, "d2t": d2t, "t2d": t2d}, str(folder))
    init_from_target(model, target_path, d2t, t2d, lm_head="random")
    model.load_state_dict(got, strict=False)
    return model.eval()


def load_checkpoint_model(ckpt: Path | str, target_path: Path | str) -> Eagle3Drafter:
    """A training checkpoint as an :class:`Eagle3Drafter` (config from its state.json), eval mode."""
    ckpt = Path(ckpt)
    state = read_state(ckpt)
    cfg = DraftConfig.from_dict(state["drafter"])
    model = Eagle3Drafter(cfg)
    init_from_target(model, target_path, torch.zeros(cfg.draft_vocab_size, dtype=torch.long),
                     torch.zeros(cfg.vocab_size, dtype=torch.bool), lm_head="random")
    load_model_weights(model, ckpt)
    return model.eval()


def vocab_overlap(src_d2t: torch.Tensor | None, n_src: int, dst_d2t: torch.Tensor) -> dict[int, int]:
    """Rows of two draft vocabularies that name the same target token.

    Args:
        src_d2t: the pretrained drafter's ``d2t`` ``[N_src]`` (``None``: draft id i is target id i, as vLLM serves
            an export without it). n_src: its ``lm_head`` rows. dst_d2t: the run's ``d2t`` ``[N]``.

    Returns:
        ``{row in the run's head: row in the pretrained head}`` for every target token both hold.
    """
    src_ids = torch.arange(n_src) + (src_d2t.long() if src_d2t is not None else 0)  # [N_src] target ids
    dst_ids = torch.arange(dst_d2t.numel()) + dst_d2t.long()  # [N] target ids
    pos = {int(t): i for i, t in enumerate(src_ids.tolist())}
    return {i: pos[t] for i, t in enumerate(dst_ids.tolist()) if t in pos}


def load_pretrained(model: Eagle3Drafter, folder: Path | str, remap: bool = True, rope: str = "refuse",
                    min_overlap: float = 0.0) -> None:
    """Initialise ``model`` (already holding the data's d2t/t2d) from a pretrained drafter for fine-tuning.

    Args:
        remap: when the pretrained draft vocabulary differs from the data's, copy the ``lm_head`` rows of
            tokens both vocabularies share (others keep their init, ``train.lm_head_init``) and log the overlap;
            ``False`` refuses any other draft vocabulary.
        min_overlap: ``train.remap_min_overlap``, the least share of the run's draft tokens the pretrained
            drafter must know for a remap.
        rope: ``train.init_rope``; anything but ``refuse`` accepts other rotary settings (``model`` was built
            with the chosen ones, see :func:`fit_to_pretrained`).

    Raises:
        ModelError: a field of :data:`COMPARED_FIELDS` or the rotary settings (with ``rope="refuse"``) differ;
            layout or shape mismatch; another draft vocabulary without ``remap``, or sharing less than
            ``min_overlap`` of the run's draft tokens; norm options
            (``norm_before_residual``, ``fc_norm``, ``norm_before_fc``, ``norm_output``, as vLLM reads them from
            the export) other than the run's.
    """
    layout, config, weights = read_export(folder)
    diff = pretrained_differences(config, layout, model.cfg)
    if rope != "refuse":
        diff.pop("rope", None)
    if diff:
        fit_to_pretrained(model.cfg, folder, rope)  # raises with the message
    ids = aux_layer_ids(config)
    ids = from_vllm_layer_ids(ids) if ids else None
    if ids and list(ids) != list(model.cfg.layer_ids):
        raise ModelError(f"pretrained drafter reads layers {ids}, the features hold {model.cfg.layer_ids}",
                         "extract features with the drafter's layer ids (train.layer_ids)")
    flags = norm_flags(config, layout)
    differ = {k: v for k, v in flags.items() if getattr(model.cfg, k) != v}
    if differ:
        raise ModelError(f"pretrained drafter at {folder} was trained with {differ}, this run has the opposite",
                         "set the same train.* norm options as the pretrained drafter")
    src_d2t = weights.get("d2t")
    same_vocab = src_d2t is not None and torch.equal(src_d2t.long(), model.d2t.cpu())
    if same_vocab:
        weights = {**weights, "t2d": model.t2d.cpu()}  # a peer's export may carry d2t only
    else:
        src_head = weights["lm_head.weight"]  # [N_src, H]
        rows = vocab_overlap(src_d2t, src_head.shape[0], model.d2t.cpu())
        n = model.d2t.numel()
        known = (f"the pretrained drafter at {folder} knows {len(rows)} of this run's {n} draft tokens "
                 f"({len(rows) / n:.1%}; its own draft vocabulary has {src_head.shape[0]})")
        if not remap:
            raise ModelError(f"{known}: another draft vocabulary, and train.remap_vocab is false",
                             "set train.remap_vocab=true to copy the lm_head rows of the shared tokens")
        if len(rows) < min_overlap * n:
            raise ModelError(f"{known}, below train.remap_min_overlap={min_overlap:g}: its head would start "
                             "mostly from scratch",
                             "pick a drafter built for this target and data, fine-tune with train.draft_vocab_size "
                             f"= {src_head.shape[0]} (its size), or lower train.remap_min_overlap")
        head = model.lm_head.weight.detach().cpu().clone()  # [N, H]: lm_head_init's rows for the tokens it lacks
        for dst, src in rows.items():
            head[dst] = src_head[src]
        weights = {**weights, "lm_head.weight": head, "d2t": model.d2t.cpu(), "t2d": model.t2d.cpu()}
        log.warning("%s: its lm_head rows remapped to this run's draft vocabulary, the other %d rows start from "
                    "train.lm_head_init (train.remap_vocab; refused below train.remap_min_overlap=%g)", known,
                    n - len(rows), min_overlap)
    got = check_weights(model, weights, str(folder))
    model.load_state_dict(got, strict=False)
    log.info("initialised from pretrained %s drafter at %s", layout, folder)
