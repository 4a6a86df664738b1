"""The peer trainer: speculators 0.9.0 (vLLM project) trains an EAGLE-3 drafter from a draftsmith run's data.

Used by the peer benchmark (``bench/peer.py``) to compare speculators' drafter with draftsmith's in vLLM. Two steps:

1. :func:`write_peer_data` (here, in the main venv): the run's training samples (``runs/<run>/data/``) in
   speculators' offline layout, with hidden states computed by transformers from the target checkpoint, and the
   run's own draft vocabulary (``data/vocab/draft-<N>``) as speculators' ``d2t-<N>.npy`` / ``t2d-<N>.npy``.
2. :func:`train_peer`: speculators' trainer (``python -m speculators.train``) in ``.peer-venv``
   (``scripts/peer-venv.sh``: its own venv, as it pins ``datasets<=5.1.0``; patched to run on CPU), as a subprocess.

Why the hidden states are recomputed: speculators trains on the three aux states AND the last decoder layer's output
BEFORE the final norm (``verifier_last_hidden_states``; its model applies the target's norm and ``lm_head`` itself),
while draftsmith's features keep that state AFTER the final norm, so they cannot be reused for the 4th state.

Output layout of :func:`write_peer_data` (``out/``; speculators' ``--data-path``):

- ``dataset_info.json``, ``state.json``, ``data-*.arrow``: a ``datasets`` dataset saved with ``save_to_disk``, torch
  format, one row per sample: ``input_ids`` int64 ``[T]``, ``loss_mask`` int64 ``[T]`` (1 = token t is one the
  target generated, i.e. supervised; the same convention as draftsmith's, so copied as is; speculators' ``shift_batch``
  pairs token t with the hidden states of position t-1), ``seq_len`` int (= T). Row i is sample ``sample_ids[i]``.
- ``hidden_states/hs_<i>.safetensors``: ``hidden_states`` bfloat16 ``[T, 4, H]`` (the three aux states, then the last
  decoder layer's output before the final norm), ``token_ids`` int64 ``[T]`` (= the row's ``input_ids``).
- ``d2t-<N>.npy`` int64 ``[N]`` (target id = i + d2t[i]) and ``t2d-<N>.npy`` bool ``[V]``: every draft vocabulary the
  run has, unchanged (the same mapping convention in both projects).
- ``peer.json``: the summary :func:`write_peer_data` returns (sample ids, aux ids in vLLM's numbering, dtypes, ...).

CLI: ``.venv/bin/python bench/peer_speculators.py --run RUN_DIR --out DIR [--epochs 1 --samples 20]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import torch
from draftsmith.errors import DraftsmithError

ROOT = Path(__file__).resolve().parents[1]
PEER_VENV = ROOT / ".peer-venv"
PEER_PYTHON = PEER_VENV / "bin" / "python"
PEER_STAMP = PEER_VENV / ".peer-installed"
SUMMARY_FILE = "peer.json"
SPECULATORS_TOTAL_SEQ_LEN = 8192  # speculators' default --total-seq-len (tokens per packed batch)
CLI_TOTAL_SEQ_LEN = 1024  # the CLI's: ~3.5x more tokens/s than 8,192 on CPU (attention over the whole pack)
HS_DTYPE = torch.bfloat16  # stored dtype; speculators casts hidden states to its hidden_states_dtype (bf16) anyway
COMPUTE_DTYPE = torch.float32  # the target runs in float32 on CPU, like draftsmith's transformers features

# Flags speculators needs on CPU (not training settings): flex attention and the fused loss are GPU kernels, its
# default of 12 dataloader workers is for a GPU host, and a missing hidden-state file must not start a vLLM request.
CPU_FLAGS = ("--draft-attn-impl", "sdpa", "--loss-implementation", "eager", "--num-workers", "1",
             "--on-missing", "raise")


class PeerError(DraftsmithError):
    """The peer trainer (its venv, its data or its run) failed: ``str(err)`` is what failed ``-> how to fix it``."""


def _vllm_aux_ids(run_dir: Path, num_layers: int) -> list[int]:
    """The run's aux layer ids in vLLM's / speculators' numbering (= draftsmith's "output of layer i" id + 1).

    From ``features/manifest.json`` when the run has features, else draftsmith's default for the target's depth.
    """
    from draftsmith.artifacts import features as features_artifact
    from draftsmith.features.layers import default_layer_ids

    manifest = features_artifact.load_manifest(run_dir / "features")
    ids = manifest["layer_ids"] if manifest and manifest.get("layer_ids") else default_layer_ids(num_layers)
    return [int(i) + 1 for i in ids]


def _write_vocabularies(run_dir: Path, out: Path) -> list[int]:
    """Copy every ``data/vocab/draft-<N>`` of the run as ``out/d2t-<N>.npy`` and ``out/t2d-<N>.npy``; returns the
    sizes N."""
    import numpy as np
    from draftsmith.artifacts import data as data_artifact
    from draftsmith.artifacts import vocab as vocab_artifact
    from draftsmith.drafter.vocab import load_draft_vocab

    sizes = []
    for name in vocab_artifact.mapping_files(data_artifact.vocab_dir(run_dir / "data")):
        n = int(Path(name).name.removeprefix("draft-").split(".")[0])
        d2t, t2d, _ = load_draft_vocab(run_dir / "data", n)  # [N] int64, [V] bool, checked consistent
        np.save(out / f"d2t-{n}.npy", d2t.numpy().astype(np.int64))
        np.save(out / f"t2d-{n}.npy", t2d.numpy().astype(np.bool_))
        sizes.append(n)
    return sorted(sizes)


@torch.inference_mode()
def _hidden_states(model, seqs: list[torch.Tensor], aux_ids: list[int]) -> list[torch.Tensor]:
    """``[T_b, len(aux_ids) + 1, H]`` (compute dtype) for each sequence ``seqs[b]`` (``[T_b]`` int64), in one
    right-padded forward (causal attention: a real position never sees the padding after it, so its states are
    those of the sequence alone): the inputs of decoder layers ``aux_ids`` (vLLM's numbering; transformers'
    ``hidden_states[i]``), then the last decoder layer's output before the final norm (the input of
    ``model.model.norm``, captured by a hook: transformers' ``hidden_states[-1]`` is after the norm)."""
    T = max(int(x.numel()) for x in seqs)
    batch = torch.stack([torch.nn.functional.pad(x, (0, T - int(x.numel()))) for x in seqs])  # [B, T]
    captured = {}
    hook = model.model.norm.register_forward_hook(lambda _m, args, _out: captured.__setitem__("last", args[0]))
    try:
        out = model.model(input_ids=batch, output_hidden_states=True)
    finally:
        hook.remove()
    states = torch.stack([out.hidden_states[i] for i in aux_ids] + [captured["last"]], dim=2)  # [B, T, 4, H]
    return [states[b, : int(x.numel())] for b, x in enumerate(seqs)]


def _batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Row indices grouped by length (shortest first) so that rows x longest row <= ``max_tokens`` (a longer row
    alone)."""
    out: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if out and (len(out[-1]) + 1) * lengths[i] <= max_tokens:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def write_peer_data(run_dir: Path, target: Path, out: Path, sample_ids: list[str] | None = None, *,
                    batch_tokens: int = 4096, all_rows: bool = False) -> dict:
    """Write a draftsmith run's training samples in speculators' offline layout (module docstring), with hidden
    states from transformers.

    The target is loaded once, in float32, and runs on right-padded batches of samples of similar length (at most
    ``batch_tokens`` padded tokens, 2-5x the tokens/s of one sample at a time here); the states are stored as
    bfloat16. Aux ids are the run's (``features/manifest.json``, else draftsmith's default), converted to vLLM's
    numbering ([2, 15, 27] for a 30-layer SmolLM2), i.e. those vLLM serves the drafter with.

    Args:
        run_dir: ``runs/<run>`` (its ``data/`` is read with :class:`draftsmith.drafter.data.TrainSamples`).
        target: the target checkpoint folder (transformers, local files only).
        out: the output folder (created; existing ``hs_*`` files and dataset files are overwritten).
        sample_ids: the samples to convert, in this order; None = all of the run's, sorted by id.
        batch_tokens: padded tokens per forward (memory: about 31 x batch_tokens x H x 4 bytes of states).
        all_rows: write an all-ones loss mask (every row supervised, as draftsmith's ``train.loss_rows: all``)
            instead of the run's (target-generated tokens only).

    Returns:
        The summary also written to ``out/peer.json``: ``samples``, ``tokens`` (all positions),
        ``supervised_tokens`` (loss mask 1), ``seconds`` (wall, target load included), ``tokens_per_s``,
        ``target_layer_ids`` (vLLM numbering), ``draft_vocab_sizes`` (the N of each ``d2t-<N>.npy``),
        ``hidden_size``, ``dtype``, ``max_seq_len`` (tokens of the longest sample), ``sample_ids``, ``data``
        (= ``out``), ``target``.

    Raises:
        draftsmith.errors.DataError: the run's data are missing or unreadable.
        KeyError: a sample id not in the run's data.
        PeerError: the run has no draft vocabulary.
    """
    from datasets import Dataset
    from draftsmith.drafter.data import TrainSamples
    from draftsmith.drafter.hf_features import load_target
    from safetensors.torch import save_file

    start = time.perf_counter()
    run_dir, target, out = Path(run_dir), Path(target), Path(out)
    samples = TrainSamples(run_dir / "data")
    ids = sorted(samples.samples) if sample_ids is None else list(sample_ids)
    missing = [s for s in ids if s not in samples.samples]
    if missing:
        raise KeyError(f"samples not in {run_dir / 'data'}: {missing[:5]} ({len(missing)} in all)")
    hs_dir = out / "hidden_states"
    hs_dir.mkdir(parents=True, exist_ok=True)
    sizes = _write_vocabularies(run_dir, out)
    if not sizes:
        raise PeerError(f"the run {run_dir} has no draft vocabulary in data/vocab/",
                        "run `draftsmith build-data` on it first")

    model = load_target(target, dtype=COMPUTE_DTYPE)
    aux_ids = _vllm_aux_ids(run_dir, int(model.config.num_hidden_layers))
    seqs = [samples.samples[sid].input_ids.to(torch.int64) for sid in ids]  # [T_i] each
    masks = [torch.ones_like(x) if all_rows else samples.samples[sid].loss_mask.to(torch.int64)
             for sid, x in zip(ids, seqs, strict=True)]  # [T_i] each, 1 = supervised
    rows = {"input_ids": [x.tolist() for x in seqs], "loss_mask": [m.tolist() for m in masks],
            "seq_len": [int(x.numel()) for x in seqs]}
    for group in _batches(rows["seq_len"], batch_tokens):
        for i, states in zip(group, _hidden_states(model, [seqs[i] for i in group], aux_ids), strict=True):
            save_file({"hidden_states": states.to(HS_DTYPE).contiguous(), "token_ids": seqs[i].contiguous()},
                      str(hs_dir / f"hs_{i}.safetensors"))  # [T_i, 4, H], [T_i]
    tokens, supervised = sum(rows["seq_len"]), int(sum(int(m.sum()) for m in masks))
    for stale in hs_dir.glob("hs_*.safetensors"):  # from an earlier, larger conversion into the same folder
        if int(stale.stem[3:]) >= len(ids):
            stale.unlink()
    dataset = Dataset.from_dict(rows)
    dataset.set_format(type="torch")
    dataset.save_to_disk(str(out))
    seconds = time.perf_counter() - start
    summary = {
        "samples": len(ids), "tokens": tokens, "supervised_tokens": supervised, "seconds": round(seconds, 2),
        "tokens_per_s": round(tokens / seconds, 1), "target_layer_ids": aux_ids, "draft_vocab_sizes": sizes,
        "hidden_size": int(model.config.hidden_size), "dtype": str(HS_DTYPE).removeprefix("torch."),
        "compute_dtype": str(COMPUTE_DTYPE).removeprefix("torch."), "data": str(out), "target": str(target),
        "max_seq_len": max(rows["seq_len"], default=0), "run": str(run_dir), "sample_ids": ids,
        "loss_rows": "all" if all_rows else "generated",
    }
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=1))
    return summary


def relabel_peer_data(src: Path, run_dir: Path, out: Path, *, all_rows: bool) -> dict:
    """:func:`write_peer_data`'s output for other loss rows without running the target again: ``out`` gets the
    same samples and draft vocabularies, its ``hidden_states`` a link to ``src``'s (the states do not depend on the
    mask), and a loss mask of all ones (``all_rows``) or the run's own.

    Raises:
        PeerError: ``src`` was not written from ``run_dir`` (another run, or sample ids not in its data).
    """
    from datasets import Dataset
    from draftsmith.drafter.data import TrainSamples

    start = time.perf_counter()
    src, out = Path(src), Path(out)
    summary = json.loads((src / SUMMARY_FILE).read_text())
    samples = TrainSamples(Path(run_dir) / "data").samples
    ids = summary["sample_ids"]
    if Path(summary["run"]).resolve() != Path(run_dir).resolve() or any(s not in samples for s in ids):
        raise PeerError(f"{src} was made from {summary['run']}, not {run_dir}",
                        "give --peer-states-from a --peer-data folder made from this run")
    out.mkdir(parents=True, exist_ok=True)
    link = out / "hidden_states"
    if link.is_symlink():
        link.unlink()
    elif link.exists():
        shutil.rmtree(link)
    link.symlink_to((src / "hidden_states").resolve())
    for f in list(src.glob("d2t-*.npy")) + list(src.glob("t2d-*.npy")):
        shutil.copyfile(f, out / f.name)
    seqs = [samples[sid].input_ids.to(torch.int64) for sid in ids]  # [T_i] each
    masks = [torch.ones_like(x) if all_rows else samples[sid].loss_mask.to(torch.int64)
             for sid, x in zip(ids, seqs, strict=True)]  # [T_i] each, 1 = supervised
    dataset = Dataset.from_dict({"input_ids": [x.tolist() for x in seqs], "loss_mask": [m.tolist() for m in masks],
                                 "seq_len": [int(x.numel()) for x in seqs]})
    dataset.set_format(type="torch")
    dataset.save_to_disk(str(out))
    summary = {**summary, "data": str(out), "loss_rows": "all" if all_rows else "generated",
               "supervised_tokens": int(sum(int(m.sum()) for m in masks)),
               "relabelled_from": str(src), "seconds": round(time.perf_counter() - start, 2)}
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=1))
    return summary


def _final_checkpoint(save_path: Path) -> Path | None:
    """The checkpoint of the last epoch speculators saved: ``save_path/<epoch>/`` with the highest epoch number that
    holds a ``config.json`` and weights (speculators' layout, which vLLM loads)."""
    epochs = [p for p in save_path.iterdir() if p.is_dir() and p.name.isdigit() and (p / "config.json").is_file()
              and any(p.glob("*.safetensors"))] if save_path.is_dir() else []
    return max(epochs, key=lambda p: int(p.name)) if epochs else None


def train_peer(
    data: Path,
    target: Path,
    out: Path,
    *,
    epochs: int,
    draft_vocab_size: int,
    ttt_steps: int,
    num_layers: int = 1,
    lr: float | None = None,
    total_seq_len: int | None = None,
    train_samples: int | None = None,
    extra: Sequence[str] = (),
    overwrite: bool = False,
    echo: bool = True,
) -> dict:
    """Train speculators' EAGLE-3 drafter on :func:`write_peer_data`'s output, in ``.peer-venv``, as a subprocess.

    Runs ``python -m speculators.train`` (through ``bench/peer_launch.py``: Muon's Newton-Schulz in float32 on a CPU
    without bf16 kernels, as draftsmith's) with speculators' own defaults except: the drafter shape (``--num-layers``,
    ``--ttt-steps``), ``--epochs``, the run's draft vocabulary (``--draft-vocab-size``, ``--d2t-path``,
    ``--t2d-path``), the aux ids the data were written with (``--target-layer-ids``); ``--lr``, ``--total-seq-len``
    and ``--train-data-ratio`` (from ``train_samples``) when given; and the CPU flags of :data:`CPU_FLAGS`. ``extra``
    is appended last (later flags win). Threads: ``OMP_NUM_THREADS`` from the environment, else all cores.

    Args:
        data: the folder :func:`write_peer_data` wrote (speculators' ``--data-path``).
        target: the target checkpoint folder (speculators' ``--verifier-name-or-path``; local, offline).
        out: where the run goes: ``out/checkpoints/<epoch>/`` (speculators' ``--save-path``), ``out/train.log``
            (its stdout and stderr), ``out/logs/``.
        epochs: training epochs. draft_vocab_size: N of a ``d2t-<N>.npy`` in ``data``. ttt_steps: TTT steps.
        num_layers: drafter decoder layers. lr: learning rate (None: speculators' default, 1e-3 with its default
            muon optimizer). total_seq_len: tokens per packed batch (None: speculators' default, 8,192).
        train_samples: train on the first this many rows of ``data`` and validate on the rest (speculators always
            holds out the LAST rows: ``--train-data-ratio`` is set so that its ``int(rows * ratio)`` is exactly
            this); None: speculators' default ratio 0.9. Write the data as ``train_ids + held_ids`` to match a
            draftsmith split.
        extra: more speculators flags. overwrite: delete an existing ``out/checkpoints`` first (else refuse: the
            trainer would resume from it). echo: stream the trainer's output to stdout as well.

    Returns:
        ``{"drafter": Path of the final checkpoint folder (config.json + model.safetensors, speculators layout),
        "wall_s": seconds of the subprocess (start-up and checkpointing included), "log": Path of train.log,
        "command": the argv, "steps": optimizer steps logged, "tokens_per_s": training tokens/s from speculators'
        own per-step profile (:func:`_step_rate`), None if none was logged}``.

    Raises:
        PeerError: no ``.peer-venv``, missing data or vocabulary, existing checkpoints without ``overwrite``, or the
            trainer failed or saved no checkpoint (the message carries the log's tail and the fix).
    """
    data, target, out = Path(data).resolve(), Path(target).resolve(), Path(out).resolve()
    if not PEER_STAMP.is_file():
        raise PeerError(f"the peer venv {PEER_VENV} is not built", "run scripts/peer-venv.sh")
    summary_path = data / SUMMARY_FILE
    if not summary_path.is_file():
        raise PeerError(f"{data} has no {SUMMARY_FILE}: not written by write_peer_data", "run write_peer_data first")
    summary = json.loads(summary_path.read_text())
    d2t, t2d = data / f"d2t-{draft_vocab_size}.npy", data / f"t2d-{draft_vocab_size}.npy"
    if not (d2t.is_file() and t2d.is_file()):
        raise PeerError(f"no draft vocabulary of size {draft_vocab_size} in {data} "
                        f"(have {summary.get('draft_vocab_sizes')})",
                        "pass a size the run has, or build the run's data with this vocabulary size")
    save_path = out / "checkpoints"
    if save_path.exists() and any(save_path.iterdir()):
        if not overwrite:
            raise PeerError(f"{save_path} already holds checkpoints (speculators would resume from them)",
                            "pass overwrite=True (--overwrite) or another output folder")
        shutil.rmtree(save_path)
    out.mkdir(parents=True, exist_ok=True)
    # bench/peer_launch.py runs `python -m speculators.train` with Muon's Newton-Schulz as draftsmith runs it here
    cmd = [str(PEER_PYTHON), str(Path(__file__).resolve().parent / "peer_launch.py"),
           "--speculator-type", "eagle3",
           "--verifier-name-or-path", str(target),
           "--data-path", str(data),
           "--save-path", str(save_path),
           "--log-dir", str(out / "logs"),
           "--epochs", str(epochs),
           "--num-layers", str(num_layers),
           "--ttt-steps", str(ttt_steps),
           "--draft-vocab-size", str(draft_vocab_size),
           "--d2t-path", str(d2t), "--t2d-path", str(t2d),
           "--target-layer-ids", *[str(i) for i in summary["target_layer_ids"]],
           *CPU_FLAGS]
    if lr is not None:
        cmd += ["--lr", str(lr)]
    if total_seq_len is not None:
        cmd += ["--total-seq-len", str(total_seq_len)]
    if train_samples is not None:
        rows = int(summary["samples"])
        if not 0 < train_samples < rows:
            raise PeerError(f"train_samples={train_samples} of {rows} rows: speculators needs at least one row on "
                            "each side of its train/validation split", "pass 0 < train_samples < rows")
        cmd += ["--train-data-ratio", repr((train_samples + 0.5) / rows)]  # int(rows * ratio) == train_samples
    cmd += list(extra)
    pack = total_seq_len or SPECULATORS_TOTAL_SEQ_LEN
    if int(summary.get("max_seq_len", 0)) > pack:
        print(f"peer: warning: samples up to {summary['max_seq_len']} tokens but {pack}-token packs: speculators cuts "
              "longer samples to the pack length (pass a larger total_seq_len to keep them whole)", file=sys.stderr)
    # GIT_DIR: speculators records `git diff HEAD` of the repository above its installed files as
    # "speculators.patch" (meant for an editable checkout of speculators); .peer-venv lies inside this repository, so
    # git would run on draftsmith's working tree (and may refresh its index). A missing GIT_DIR makes git fail fast.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONUNBUFFERED": "1", "GIT_DIR": str(out / "no-git"), "GIT_OPTIONAL_LOCKS": "0"}
    # speculators' dataloader setup does setdefault("OMP_NUM_THREADS", "1") for its workers, in the trainer's own
    # process too: set it here so the trainer keeps its intra-op threads.
    env.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    log_path = out / "train.log"
    tail: deque[str] = deque(maxlen=25)
    start = time.perf_counter()
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=out, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            tail.append(line.rstrip("\n"))
            if echo:
                sys.stdout.write(line)
                sys.stdout.flush()
        rc = proc.wait()
    wall = time.perf_counter() - start
    for patch in save_path.glob("**/speculators.patch"):  # empty (see GIT_DIR): not a speculators change
        patch.unlink()
    drafter = _final_checkpoint(save_path)
    if rc != 0 or drafter is None:
        what = f"exit status {rc}" if rc != 0 else "no checkpoint with config.json and weights was saved"
        raise PeerError(
            f"speculators' trainer failed ({what}); log {log_path}, last lines:\n  " + "\n  ".join(tail),
            "fix the cause in the log; an import or device error: rebuild the venv (rm -rf .peer-venv && "
            "scripts/peer-venv.sh); a flag error: check `extra` against `.peer-venv/bin/python -m speculators.train "
            "--help`")
    return {"drafter": drafter, "wall_s": round(wall, 1), "log": log_path, "command": cmd, **_step_rate(log_path)}


def _step_rate(log_path: Path) -> dict:
    """``{"steps": n, "tokens_per_s": float | None}`` from speculators' per-step profile lines (``log_freq`` 1):
    real tokens of the logged steps / their step time, leaving out the first step (one-off costs: allocations,
    thread pools) when there are 3 or more. A pack's padding costs time but counts no token."""
    text = log_path.read_text()
    rates = [float(v) for v in re.findall(r"profile/tokens_per_s=([0-9.e+-]+)", text)]  # tokens / s per step
    times = [float(v) / 1000 for v in re.findall(r"profile/step_ms=([0-9.e+-]+)", text)]  # s per step
    if not rates or len(rates) != len(times):
        return {"steps": len(rates), "tokens_per_s": None}
    pairs = list(zip(rates, times, strict=True))
    pairs = pairs[1:] if len(pairs) >= 3 else pairs
    return {"steps": len(rates), "tokens_per_s": round(sum(r * t for r, t in pairs) / sum(t for _, t in pairs), 1)}


def main(argv: list[str] | None = None) -> int:
    """Convert a run's samples and train speculators' drafter on them; prints the drafter folder and wall times."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", type=Path, required=True, help="draftsmith run folder (runs/<run>) with data/")
    p.add_argument("--out", type=Path, required=True, help="output folder: data/ and train/ go under it")
    p.add_argument("--target", type=Path, default=None,
                   help="target checkpoint folder (default: the embedded SmolLM2 of draftsmith's config)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--samples", type=int, default=None, help="the first N samples (sorted ids); default all")
    p.add_argument("--draft-vocab-size", type=int, default=None, help="default: the run's only (or largest) one")
    p.add_argument("--ttt-steps", type=int, default=None,
                   help="TTT steps; default draftsmith's train.ttt_steps (7 unless configured; speculators' own is 3)")
    p.add_argument("--num-layers", type=int, default=1)
    p.add_argument("--lr", type=float, default=None, help="default: speculators' (1e-3, muon)")
    p.add_argument("--total-seq-len", type=int, default=None,
                   help=f"tokens per packed batch; default {CLI_TOTAL_SEQ_LEN} or the longest sample when longer "
                        f"(speculators' own default {SPECULATORS_TOTAL_SEQ_LEN} is ~3.5x slower per token on CPU)")
    p.add_argument("--overwrite", action="store_true", help="replace existing checkpoints under --out")
    p.add_argument("extra", nargs="*", help="more speculators flags, after --")
    a = p.parse_args(argv)

    from draftsmith.config import load_settings
    from draftsmith.drafter.data import TrainSamples
    from draftsmith.target.checkpoint import target_checkpoint

    settings = load_settings(None, {})
    target = a.target or target_checkpoint(settings)
    ttt_steps = a.ttt_steps or int(settings.train.ttt_steps)

    ids = sorted(TrainSamples(a.run / "data").samples)[: a.samples]
    conv = write_peer_data(a.run, target, a.out / "data", ids)
    print(f"peer data: {conv['samples']} samples, {conv['tokens']} tokens in {conv['seconds']} s "
          f"({conv['tokens_per_s']} tokens/s), aux ids {conv['target_layer_ids']}, vocabularies "
          f"{conv['draft_vocab_sizes']}", flush=True)
    n = a.draft_vocab_size or max(conv["draft_vocab_sizes"])
    res = train_peer(a.out / "data", target, a.out / "train", epochs=a.epochs, draft_vocab_size=n,
                     ttt_steps=ttt_steps, num_layers=a.num_layers, lr=a.lr,
                     total_seq_len=a.total_seq_len or max(CLI_TOTAL_SEQ_LEN, conv["max_seq_len"]), extra=a.extra,
                     overwrite=a.overwrite)
    print(f"drafter: {res['drafter']}")
    print(f"train wall: {res['wall_s']} s for {a.epochs} epoch(s) over {conv['tokens']} tokens, {res['steps']} steps, "
          f"{res['tokens_per_s']} training tokens/s (speculators' step profile; log {res['log']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
