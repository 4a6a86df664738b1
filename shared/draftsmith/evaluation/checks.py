"""Refuse a drafter that does not fit the target before any engine starts (minutes saved, no silent zero).

Checked against the target's ``config.json`` and the drafter's folder in either layout vLLM loads
(``docs/formats.md``): ``eagle3`` (EAGLE / SpecForge, weights ``midlayer.*``) or ``speculators`` (the decoder's
fields under ``transformer_layer_config``, weights ``layers.0.*``), ours or a peer's. What is checked: hidden size
(``fc.weight`` is ``[H_d, 3*H_t]``), target vocabulary (``vocab_size`` equals the target's; ``t2d``, when present,
has one entry per target token), draft vocabulary (``d2t`` and ``lm_head`` have ``draft_vocab_size`` rows), aux
layer ids (three distinct ids inside ``[0, L-1]``, vLLM's numbering) and the position limit (a drafter with a smaller
``max_position_embeddings`` silently killed acceptance, SpecForge #249).

What vLLM 0.32 accepts is accepted (``llama_eagle3.py``, ``configs/speculators/algos.py``): no ``t2d`` (vLLM never
reads it; speculators writes ``d2t`` and ``t2d`` only for a draft vocabulary smaller than the target's), no ``d2t``
(draft id i is then target id i), no ``draft_vocab_size`` (the target vocabulary), no aux layer ids (vLLM's default
``(2, L//2, L-3)``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from draftsmith.artifacts.export import (
    aux_layer_ids,
    config_path,
    internal_name,
    layer_fields,
    require_layout,
)
from draftsmith.drafter.families import family_of_export
from draftsmith.errors import ModelError
from draftsmith.log import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class DrafterInfo:
    """What the evaluator needs to know about a drafter that fits its target."""

    path: Path
    layout: str  # eagle3 or speculators
    hidden_size: int
    target_hidden_size: int
    vocab_size: int
    draft_vocab_size: int
    layer_ids: tuple[int, ...]
    code_version: str | None = None  # the draftsmith build that exported it; None for a peer's or an older export
    family: str = "eagle3"  # the drafter family (draftsmith.drafter.families.family_of_export)


def _read_config(folder: Path, what: str) -> dict:
    cfg = config_path(folder)
    if not cfg.is_file():
        raise ModelError(f"the {what} folder {folder} has no {cfg.name}", f"pass the {what}'s checkpoint folder")
    try:
        return json.loads(cfg.read_text())
    except json.JSONDecodeError as e:
        raise ModelError(f"{cfg} is not valid JSON ({e.msg})", f"re-export the {what}") from e


def _shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Shape of every weight in the folder's ``*.safetensors`` (vLLM loads them all), by internal name."""
    from safetensors import safe_open

    out: dict[str, tuple[int, ...]] = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                out[internal_name(key)] = tuple(f.get_slice(key).get_shape())
    return out


def check_drafter_fits(target_dir: Path, drafter_dir: Path) -> DrafterInfo:
    """Check that an EAGLE-3 drafter (either layout, ours or a peer's) fits its target.

    Args:
        target_dir: the target's checkpoint folder (its ``config.json`` is read).
        drafter_dir: the drafter's folder: ``config.json`` (eagle3 or speculators layout) + ``*.safetensors``.

    Returns:
        :class:`DrafterInfo` (``layer_ids`` in vLLM's numbering).

    Raises:
        ModelError: a folder that holds neither layout, a missing file or weight, or a hidden size, vocabulary,
            draft vocabulary, layer id or position limit that does not fit the target; the message names both
            values and the fix.
    """
    drafter_dir = Path(drafter_dir)
    t = _read_config(Path(target_dir), "target")
    d = _read_config(drafter_dir, "drafter")
    layout = require_layout(drafter_dir, d)
    layer = layer_fields(d, layout)
    tcfg = t.get("text_config", t)
    h_t, v_t, n_layers = int(tcfg["hidden_size"]), int(tcfg["vocab_size"]), int(tcfg["num_hidden_layers"])
    shapes = _shapes(drafter_dir)
    if not shapes:
        raise ModelError(f"the drafter folder {drafter_dir} has no *.safetensors", "run `draftsmith export`")
    for key in ("fc.weight", "lm_head.weight", "layers.0.self_attn.q_proj.weight"):
        if key not in shapes:
            found = ", ".join(sorted(shapes)[:6])
            raise ModelError(
                f"the drafter {drafter_dir} ({layout} layout) has no {key!r} weight (it is not an EAGLE-3 drafter; "
                f"found {found}, ...)",
                "export it with `draftsmith export` (weights fc, midlayer.* or layers.0.*, norm, lm_head, d2t, t2d)",
            )
    layer_ids = tuple(aux_layer_ids(d) or (2, n_layers // 2, n_layers - 3))  # vLLM's default when absent
    h_d = int(layer.get("hidden_size") or shapes["fc.weight"][0])
    fc_out, fc_in = shapes["fc.weight"]
    n_aux = len(layer_ids) or 3
    if fc_in != n_aux * h_t:
        raise ModelError(
            f"drafter/target hidden size mismatch: fc.weight takes {fc_in} features but the target has "
            f"{n_aux} aux layers x hidden {h_t} = {n_aux * h_t}",
            "train the drafter on this target's features (`draftsmith extract` + `train`)",
        )
    if fc_out != h_d:
        raise ModelError(f"drafter fc.weight gives {fc_out} features but its hidden_size is {h_d}", "re-export it")
    v_d = int(layer.get("vocab_size", v_t))
    t2d_rows = shapes["t2d"][0] if "t2d" in shapes else v_t
    if v_d != v_t or t2d_rows != v_t:
        raise ModelError(
            f"drafter/target vocabulary mismatch: drafter vocab_size {v_d}, t2d over {t2d_rows} tokens, "
            f"target vocab {v_t}",
            "build the draft vocabulary from data tokenized with this target's tokenizer and retrain",
        )
    n_draft = int(d.get("draft_vocab_size") or v_t)
    d2t_rows = shapes["d2t"][0] if "d2t" in shapes else n_draft
    if d2t_rows != n_draft or shapes["lm_head.weight"][0] != n_draft:
        raise ModelError(
            f"draft vocabulary mismatch: draft_vocab_size {n_draft}, d2t {d2t_rows}, "
            f"lm_head {shapes['lm_head.weight'][0]} rows",
            "re-export the drafter with the mapping it was trained with",
        )
    if "d2t" not in shapes and n_draft != v_t:
        log.warning("drafter %s has no d2t: vLLM reads its %d draft ids as the first %d target ids", drafter_dir,
                    n_draft, n_draft)
    if len(layer_ids) != 3 or len(set(layer_ids)) != 3 or not all(0 <= i < n_layers for i in layer_ids):
        raise ModelError(
            f"drafter aux layer ids {list(layer_ids)} do not fit a target with {n_layers} layers",
            f"use three distinct ids in [0, {n_layers - 1}] (vLLM convention, e.g. [1, {n_layers // 2 - 1}, "
            f"{n_layers - 4}]) as written by `draftsmith export`",
        )
    mp_t, mp_d = tcfg.get("max_position_embeddings"), layer.get("max_position_embeddings")
    if mp_t and mp_d and int(mp_d) < int(mp_t):
        raise ModelError(
            f"drafter max_position_embeddings {mp_d} is below the target's {mp_t} (silently kills acceptance)",
            "re-export the drafter copying max_position_embeddings and rope settings from the target",
        )
    return DrafterInfo(drafter_dir, layout, h_d, h_t, v_t, n_draft, layer_ids, d.get("code_version"),
                       family_of_export(d))


def check_engine_reads_layout(engine: str, info: DrafterInfo) -> None:
    """Refuse a layout the engine cannot load: SGLang reads the eagle3 layout only (``docs/training.md``).

    Raises:
        ModelError: ``engine`` is ``sglang`` or ``both`` and the drafter is in the speculators layout.
    """
    if engine in ("sglang", "both") and info.layout != "eagle3":
        raise ModelError(f"SGLang loads EAGLE-3 drafters in the eagle3 layout only; {info.path} is {info.layout}",
                         "pass the run's export/eagle3 (`draftsmith export --format eagle3`), or --engine vllm")
