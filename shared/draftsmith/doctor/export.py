"""Check: the export against what the engine will read (docs/doctor.md, "export").

Read from the export's files as vLLM 0.32 and SGLang read them (:mod:`draftsmith.artifacts.export`), compared with
the drafter as it was trained (the latest checkpoint's ``state.json``, the features manifest, the data's draft
vocabulary): aux layer ids in the engine's numbering, norm weights and flags, the ``d2t`` map, rotary settings in
both the fields new and old readers use, the position limit, and config keys no engine reads.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import torch

from draftsmith.artifacts.export import (
    CONFIG_FILE,
    EAGLE3,
    WEIGHTS_FILE,
    aux_layer_ids,
    layer_fields,
    norm_flags,
)
from draftsmith.artifacts.features import MANIFEST_FILE as FEATURES_MANIFEST
from draftsmith.doctor.finding import CheckResult, Finding, skipped
from draftsmith.doctor.run import RunView
from draftsmith.drafter.config import rope_of, same_rope
from draftsmith.errors import ModelError
from draftsmith.features.layers import sglang_reads

CHECK = "export"

# Estimated share of acceptance lost (docs/doctor.md): these break every draft, so they outrank every measured
# share-of-tokens finding except a near-total one.
COST_AUX_IDS = 0.95  # the fc layer fuses other tensors than it was trained on: acceptance near zero (TorchSpec #89)
COST_MISSING_WEIGHT = 0.9  # the engine keeps its init (ones for a norm, random for the rest) without a word
COST_NORM_FLAGS = 0.8  # the engine normalises elsewhere than training did
COST_ROPE = 0.5  # positions rotate differently: acceptance falls with distance (SpecForge #113)
COST_MAX_POSITIONS = 0.5  # SpecForge #249: a smaller limit silently killed acceptance
COST_NEAR_KEY = 0.3  # a key one typo from one the engine reads: the intended setting is lost
COST_UNKNOWN_KEY = 0.02  # read by no engine; harmless unless it was meant to change something

# Top-level keys the two layouts carry beyond a Llama config (drafter/families/eagle3/export.py writes them; vLLM and SGLang read
# them, or ignore them on purpose: speculators' version and proposal settings, and draftsmith's own provenance:
# its block and the code_version every artifact records).
EXPORT_KEYS = ("draft_vocab_size", "target_hidden_size", "norm_before_residual", "fc_norm", "norm_before_fc",
               "norm_output", "eagle_config", "speculators_model_type", "speculators_version",
               "transformer_layer_config", "eagle_aux_hidden_state_layer_ids", "speculators_config",
               "rope_parameters", "rope_theta", "rope_scaling", "torch_dtype", "dtype", "transformers_version",
               "draftsmith", "code_version")


def known_keys() -> set[str]:
    """Config keys an engine reads from an EAGLE-3 export: a Llama config's and :data:`EXPORT_KEYS`."""
    from transformers import LlamaConfig

    return set(LlamaConfig().to_dict()) | set(EXPORT_KEYS)


def expected_weights(cfg) -> set[str]:
    """Internal weight names a drafter of ``cfg`` stores (built on the meta device: no memory)."""
    from draftsmith.drafter.checkpoint import FROZEN
    from draftsmith.drafter.families.eagle3.model import Eagle3Drafter

    with torch.device("meta"):
        model = Eagle3Drafter(cfg)
    return {k for k in model.state_dict() if k not in FROZEN and not k.startswith("rotary.")}


def _aux_ids(run: RunView, folder: Path, layout: str, config: dict) -> list[Finding]:
    trained = (run.features_manifest or {}).get("layer_ids") or (
        list(run.drafter_config.layer_ids) if run.drafter_config else None)
    if not trained:
        return []
    ids = aux_layer_ids(config)
    n = int((run.target_config or {}).get("num_hidden_layers", 0))
    if ids is None and n:
        ids = [2, n // 2, n - 3]  # vLLM's default when the export names none
    if ids is None:
        return []
    vllm_reads = [k - 1 for k in ids]  # vLLM captures id k after decoder layer k - 1
    out = []
    if vllm_reads != list(trained):
        out.append(Finding(
            CHECK, f"aux layer ids off: vLLM feeds the drafter outputs of layers {vllm_reads}, it was trained on "
            f"{list(trained)}", COST_AUX_IDS,
            f"{folder.name}/{CONFIG_FILE} eagle_aux_hidden_state_layer_ids {ids} (vLLM numbering: id k = output of "
            f"layer k-1); features/{FEATURES_MANIFEST} layer_ids {list(trained)} (output of layer i)",
            f"write ids {[i + 1 for i in trained]} (`draftsmith export` does; notes in features/layers.py)"))
    elif layout == EAGLE3 and sglang_reads(ids) != list(trained):
        out.append(Finding(
            CHECK, f"aux layer ids read one layer off by SGLang: outputs of {sglang_reads(ids)}, trained on "
            f"{list(trained)}", COST_AUX_IDS, f"{folder.name}/{CONFIG_FILE} ids {ids}: SGLang adds 1 when the first is 1",
            "serve this drafter from the speculators layout in vLLM, or train on layers that do not start at 0"))
    return out


def _weights(run: RunView, folder: Path, layout: str, config: dict, weights: dict) -> list[Finding]:
    cfg = run.drafter_config
    if cfg is None:
        return []
    out = []
    flags = norm_flags(config, layout)
    differ = {k: (v, getattr(cfg, k)) for k, v in flags.items() if getattr(cfg, k) != v}
    if differ:
        ev = "; ".join(f"{k}: engine reads {a}, trained {b}" for k, (a, b) in differ.items())
        out.append(Finding(CHECK, f"norm options served otherwise than trained ({', '.join(differ)})",
                           COST_NORM_FLAGS, f"{folder.name}/{CONFIG_FILE}: {ev}",
                           "write every norm flag explicitly (`draftsmith export` does): vLLM's speculators reader "
                           "defaults norm_before_residual to true, its EAGLE reader to false"))
    want = expected_weights(cfg) - {"t2d"}  # vLLM never reads t2d
    missing = sorted(want - set(weights) - {"d2t"})
    norms = [k for k in missing if "norm" in k]
    if norms:
        out.append(Finding(CHECK, f"norm weight missing from the export: {', '.join(norms)}", COST_MISSING_WEIGHT,
                           f"{folder.name}/{WEIGHTS_FILE} has {len(weights)} tensors, no {norms}; the engine "
                           "keeps its initial weights (ones) for it, the drafter was trained with learned ones",
                           "re-export from the checkpoint (`draftsmith export`); a converter that renames weights "
                           "must keep norm.weight"))
    rest = [k for k in missing if k not in norms]
    if rest:
        out.append(Finding(CHECK, f"weights missing from the export: {', '.join(rest[:5])}", COST_MISSING_WEIGHT,
                           f"{folder.name}/{WEIGHTS_FILE} lacks {len(rest)} of the trained drafter's weights",
                           "re-export from the checkpoint (`draftsmith export`)"))
    return out


def _vocab(run: RunView, folder: Path, config: dict, weights: dict) -> list[Finding]:
    from draftsmith.drafter.load import vocab_maps
    if run.draft_vocab is None or run.target_config is None:
        return []
    d2t_run, _ = run.draft_vocab
    try:
        d2t, _ = vocab_maps(config, weights, int(run.target_config["vocab_size"]))
    except ModelError as e:
        return [Finding(CHECK, "the export's d2t/t2d maps disagree", 0.5, str(e), "re-export the drafter")]
    served = torch.arange(d2t.numel()) + d2t  # target id of each draft id, as served  [N]
    trained = torch.arange(d2t_run.numel()) + d2t_run  # [N]
    if served.numel() != trained.numel():
        return [Finding(CHECK, "the export's draft vocabulary has another size than the run's", 0.9,
                        f"d2t {served.numel()} rows, data/vocab {trained.numel()}", "re-export the drafter")]
    wrong = (served != trained).float().mean().item()
    if wrong == 0:
        return []
    first = int((served != trained).nonzero()[0])
    return [Finding(CHECK, f"d2t maps {wrong:.1%} of draft ids to other target tokens than in training", wrong,
                    f"draft id {first}: served as target token {int(served[first])}, trained as "
                    f"{int(trained[first])}" + ("" if "d2t" in weights else " (the export has no d2t)"),
                    "re-export with the data's draft vocabulary (`draftsmith export`)")]


def _rope(run: RunView, folder: Path, layout: str, config: dict) -> list[Finding]:
    layer = layer_fields(config, layout)
    if run.drafter_config is None:
        return []
    trained = dict(run.drafter_config.rope_parameters)
    new = rope_of(layer)  # rope_parameters first (transformers >= 5, vLLM 0.32)
    legacy = rope_of({k: v for k, v in layer.items() if k != "rope_parameters"})  # rope_theta + rope_scaling
    out = []
    for reader, rope in (("rope_parameters (vLLM, transformers >= 5)", new), ("rope_theta/rope_scaling (SGLang, "
                                                                              "older readers)", legacy)):
        if not same_rope(rope, trained):
            out.append(Finding(CHECK, f"rotary settings differ from training in {reader.split(' (')[0]}",
                               COST_ROPE, f"{folder.name}/{CONFIG_FILE} {reader}: {rope}; trained with {trained}",
                               "re-export (`draftsmith export` writes both forms from the trained config)"))
            break
    return out


def _positions(run: RunView, folder: Path, layout: str, config: dict) -> list[Finding]:
    mp = layer_fields(config, layout).get("max_position_embeddings")
    if not mp:
        return []
    mp = int(mp)
    longest = max(run.data_lengths, default=0)
    target_mp = int((run.target_config or {}).get("max_position_embeddings") or 0)
    served = int(((run.settings.get("target") or {}).get("max_model_len")) or 0)
    limits = {"the longest training sample": longest, "the target's max_position_embeddings": target_mp,
              "the served context (target.max_model_len)": served}
    over = {k: v for k, v in limits.items() if v > mp}
    if not over:
        return []
    return [Finding(CHECK, f"drafter max_position_embeddings {mp} is below {', '.join(over)}", COST_MAX_POSITIONS,
                    "; ".join(f"{k} {v}" for k, v in over.items()),
                    "re-export copying max_position_embeddings from the target (`draftsmith export` does)")]


def _keys(folder: Path, layout: str, config: dict) -> list[Finding]:
    known = known_keys()
    keys = set(config) | set(layer_fields(config, layout))
    unknown = sorted(k for k in keys if k not in known)
    out = []
    for k in unknown:
        near = difflib.get_close_matches(k, known, n=1, cutoff=0.85)
        out.append(Finding(CHECK, f"config key {k!r} is read by no engine" + (f" (meant {near[0]!r}?)" if near else ""),
                           COST_NEAR_KEY if near else COST_UNKNOWN_KEY, f"{folder.name}/{CONFIG_FILE}: {k}="
                           f"{config.get(k, layer_fields(config, layout).get(k))!r}; SGLang and vLLM skip unknown "
                           "keys without a word", f"rename it to {near[0]!r}" if near else "drop it, or move its "
                           "meaning into a key the engine reads"))
    return out


def check(run: RunView) -> CheckResult:
    """The export check (see the module doc); one result over every export folder.

    Raises:
        DoctorInputError: an export folder that cannot be read.
    """
    if not run.export_dirs:
        return skipped(CHECK, "no export (runs/<run>/export/eagle3 or speculators, or --drafter)")
    findings: list[Finding] = []
    for folder, layout, config, weights in run.exports:
        findings += _aux_ids(run, folder, layout, config)
        findings += _weights(run, folder, layout, config, weights)
        findings += _vocab(run, folder, config, weights)
        findings += _rope(run, folder, layout, config)
        findings += _positions(run, folder, layout, config)
        findings += _keys(folder, layout, config)
    note = "" if run.drafter_config else "no checkpoint: norms, weights and rope not compared with training"
    return CheckResult(CHECK, True, merged(findings), note)


def merged(findings: list[Finding]) -> list[Finding]:
    """One finding per cause: the same cause in both layouts is one fix, its evidence names both folders."""
    out: dict[str, Finding] = {}
    for f in findings:
        if f.cause in out:
            out[f.cause].evidence += " | " + f.evidence
        else:
            out[f.cause] = f
    return list(out.values())
