"""Refuse a drafter that does not fit the target before any engine starts (minutes saved, no silent zero).

Checked against the target's ``config.json`` and the drafter's EAGLE-layout export (``config.json`` +
``model.safetensors``, ``docs/formats.md``): hidden size (``fc.weight`` is ``[H_d, 3*H_t]``), target
vocabulary (``t2d`` has one entry per target token; ``vocab_size`` equals the target's), draft vocabulary (``d2t``
and ``lm_head`` have ``draft_vocab_size`` rows, ``t2d`` has that many true entries), aux layer ids (three distinct
ids inside ``[0, L-1]``, vLLM/SpecForge convention: output of decoder layer i) and the position limit (a drafter
with a smaller ``max_position_embeddings`` silently killed acceptance, SpecForge #249).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from draftsmith.artifacts.export import config_path, weights_path
from draftsmith.errors import ModelError


@dataclass(frozen=True)
class DrafterInfo:
    """What the evaluator needs to know about a drafter that fits its target."""

    path: Path
    hidden_size: int
    target_hidden_size: int
    vocab_size: int
    draft_vocab_size: int
    layer_ids: tuple[int, ...]


def _read_config(folder: Path, what: str) -> dict:
    cfg = config_path(folder)
    if not cfg.is_file():
        raise ModelError(f"the {what} folder {folder} has no {cfg.name}", f"pass the {what}'s checkpoint folder")
    try:
        return json.loads(cfg.read_text())
    except json.JSONDecodeError as e:
        raise ModelError(f"{cfg} is not valid JSON ({e.msg})", f"re-export the {what}") from e


def _shapes(path: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    out: dict[str, tuple[int, ...]] = {}
    with safe_open(str(path), framework="pt") as f:
        for key in f.keys():
            out[key] = tuple(f.get_slice(key).get_shape())
    return out


def check_drafter_fits(target_dir: Path, drafter_dir: Path) -> DrafterInfo:
    """Check that an EAGLE-3 drafter export fits its target.

    Args:
        target_dir: the target's checkpoint folder (its ``config.json`` is read).
        drafter_dir: the drafter's EAGLE-layout folder (``config.json`` + ``model.safetensors``).

    Returns:
        :class:`DrafterInfo`.

    Raises:
        ModelError: a missing file or weight, or a hidden size, vocabulary, draft vocabulary, layer id or
            position limit that does not fit the target; the message names both values and the fix.
    """
    drafter_dir = Path(drafter_dir)
    t = _read_config(Path(target_dir), "target")
    d = _read_config(drafter_dir, "drafter")
    tcfg = t.get("text_config", t)
    h_t, v_t, n_layers = int(tcfg["hidden_size"]), int(tcfg["vocab_size"]), int(tcfg["num_hidden_layers"])
    weights = weights_path(drafter_dir)
    if not weights.is_file():
        raise ModelError(f"the drafter folder {drafter_dir} has no {weights.name}", "run `draftsmith export`")
    shapes = _shapes(weights)
    for key in ("fc.weight", "d2t", "t2d", "lm_head.weight"):
        if key not in shapes:
            raise ModelError(
                f"the drafter {weights} has no {key!r} weight (it is not an EAGLE-3 export)",
                "export it with `draftsmith export` (EAGLE layout: fc, midlayer.*, norm, lm_head, d2t, t2d)",
            )
    eagle = d.get("eagle_config") or {}
    layer_ids = tuple(int(i) for i in (eagle.get("eagle_aux_hidden_state_layer_ids") or d.get(
        "eagle_aux_hidden_state_layer_ids") or ()))
    h_d = int(d["hidden_size"])
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
    v_d = int(d.get("vocab_size", v_t))
    if v_d != v_t or shapes["t2d"][0] != v_t:
        raise ModelError(
            f"drafter/target vocabulary mismatch: drafter vocab_size {v_d}, t2d over {shapes['t2d'][0]} tokens, "
            f"target vocab {v_t}",
            "build the draft vocabulary from data tokenized with this target's tokenizer and retrain",
        )
    n_draft = int(d.get("draft_vocab_size", shapes["lm_head.weight"][0]))
    if shapes["d2t"][0] != n_draft or shapes["lm_head.weight"][0] != n_draft:
        raise ModelError(
            f"draft vocabulary mismatch: draft_vocab_size {n_draft}, d2t {shapes['d2t'][0]}, "
            f"lm_head {shapes['lm_head.weight'][0]} rows",
            "re-export the drafter with the mapping it was trained with",
        )
    if len(layer_ids) != 3 or len(set(layer_ids)) != 3 or not all(0 <= i < n_layers for i in layer_ids):
        raise ModelError(
            f"drafter aux layer ids {list(layer_ids)} do not fit a target with {n_layers} layers",
            f"use three distinct ids in [0, {n_layers - 1}] (vLLM convention, e.g. [1, {n_layers // 2 - 1}, "
            f"{n_layers - 4}]) as written by `draftsmith export`",
        )
    mp_t, mp_d = tcfg.get("max_position_embeddings"), d.get("max_position_embeddings")
    if mp_t and mp_d and int(mp_d) < int(mp_t):
        raise ModelError(
            f"drafter max_position_embeddings {mp_d} is below the target's {mp_t} (silently kills acceptance)",
            "re-export the drafter copying max_position_embeddings and rope settings from the target",
        )
    return DrafterInfo(drafter_dir, h_d, h_t, v_t, n_draft, layer_ids)
