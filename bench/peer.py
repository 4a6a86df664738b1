"""draftsmith's drafter against the peer trainer's (speculators), trained on the same data and measured in vLLM.

Follows the protocol of docs/benchmarks.md ("The fair protocol"). Both sides get the same samples (a draftsmith run's
``data/``: token ids and loss masks of the regenerated conversations), the same drafter shape (one decoder layer),
the same TTT depth, the same draft vocabulary size and the same number of epochs, under the same bf16 autocast (the
peer's trainer always runs under it), and each side is trained once per seed (``--seeds N``: seeds 0..N-1, given to
both trainers). draftsmith trains with its demo recipe (``draftsmith.demo_sizes.RECIPE``) on its stored features;
speculators trains with its own defaults in its own virtualenv (``scripts/peer-venv.sh``; the CPU patches are listed
there), on hidden states made for it by ``bench/peer_speculators.py`` (the same aux layers, the last layer before
the final norm, the same d2t/t2d), in packs of ``--peer-pack`` tokens, on every sample but one (its trainer always
keeps its last rows for validation); ``--peer-lr`` and ``--peer-all-rows`` (an all-ones loss mask, as draftsmith's
``loss_rows: all``) are its tuning knobs. Each drafter is then served by vLLM CPU beside the embedded target (K
speculative tokens, temperature 0) and answers the chosen prompts of every bundled set (``--split``/``--prompts``:
the report prompts 41-80 unless told) and of every ``--eval-sets`` file, one prompt at a time, so that vLLM's
counters give each prompt's drafts and accepted tokens.

Prints per side: mean acceptance length overall and per set, per seed, training wall time; then
``RATIO peer_acceptance <draftsmith / speculators>`` (the ratio of the mean acceptance lengths, all seeds pooled) and
``INTERVAL peer_acceptance <low> <high>``: a 95 % bootstrap over the seeds and the prompts together
(``bench/protocol.py``: ``seeded_ratio``), then the same per set (``RATIO peer_acceptance_<set>``...).
``DIR/peer.json`` (``--keep DIR``) records the conditions (a SHA-256 of the data, epochs, vocabulary, K, seeds,
prompts, the sets' SHA-256) and both sides' resolved configs and counts; the peer's training logs lie beside it.

    .venv/bin/python bench/peer.py --run runs/demo --seeds 3 --epochs 1 --split report --keep DIR
    .venv/bin/python bench/peer.py --quick          (make peer-quick: minutes, small and noisy; the harness check)

``--quick`` builds its own small run: GSM8K train questions with their reference answers (the dataset's, not the
target's: ``data/prompts/gsm8k_train.jsonl``, MIT licence) through ``build-data`` and ``extract``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from draftsmith.artifacts.vocab import mapping_sizes

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from protocol import (  # noqa: E402
    PromptCounts,
    acceptance_length,
    data_sha256,
    eval_sets,
    measure_in_vllm,
    prompt_range,
    seeded_ratio,
)

RECORD_SCHEMA = "draftsmith.record/1"
PEER_SCHEMA = "draftsmith.peer-side/2"


@dataclass
class Trained:
    """One training of one side: its seed, drafter folder, training seconds, per-prompt counts and where its
    training log and resolved config are."""

    seed: int
    drafter: Path
    train_s: float
    prompts: list[PromptCounts] = field(default_factory=list)
    log: str | None = None
    resolved: str | None = None


@dataclass
class Side:
    """One trainer's side: its name, the training config both trainers' seeds share, and one :class:`Trained` per
    seed."""

    name: str
    config: dict
    runs: list[Trained] = field(default_factory=list)

    def counts(self) -> dict[int, list[PromptCounts]]:
        """Seed -> per-prompt counts (what :func:`protocol.seeded_ratio` takes)."""
        return {r.seed: r.prompts for r in self.runs}


def _cli(args: list[str], env: dict[str, str], log: Path) -> None:
    """``draftsmith <args>`` with its output in ``log``. Raises SystemExit with the log's tail on failure."""
    with log.open("a") as f:
        p = subprocess.run([sys.executable, "-m", "draftsmith", *args], env=env, stdout=f, stderr=subprocess.STDOUT,
                           timeout=4 * 3600)
    if p.returncode != 0:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"draftsmith {' '.join(args)} failed ({p.returncode}); log {log}:\n{tail}")


def quick_run(runs: Path, target: Path, samples: int, env: dict[str, str], logs: Path) -> Path:
    """A small run of GSM8K reference conversations: records, ``build-data``, ``extract --sync``; its folder."""
    from draftsmith.generation.store import write_shard

    rows = [json.loads(x) for x in (REPO / "data" / "prompts" / "gsm8k_train.jsonl").read_text().splitlines()]
    recs = []
    for k, r in enumerate(rows[:samples]):
        recs.append({"schema": RECORD_SCHEMA, "id": f"q{k:04d}", "status": "ok", "error": None, "model": target.name,
                     "messages": [{"role": "user", "content": r["question"]},
                                  {"role": "assistant", "content": r["answer"], "reasoning": None}],
                     "turns": [{"finish_reason": "stop", "usage": {}, "token_ids": None, "prompt_token_ids": None,
                                "reasoning_field": None, "latency_s": 0.0}],
                     "sampling": {"temperature": 0.0}})
    write_shard(runs / "quick" / "records", "quick", recs)
    _cli(["build-data", "--run", "quick"], env, logs / "build-data.log")
    _cli(["extract", "--run", "quick", "--sync"], env, logs / "extract.log")
    return runs / "quick"


def ours_config(a) -> dict:
    """draftsmith's training config for this comparison: the demo recipe, the shared shape and epochs, the
    comparison's ``--precision`` (the peer's too: the same arithmetic on both sides, whatever draftsmith's own
    precision rule picks on this CPU), and the ``--ours`` variants (``KEY=VALUE``, JSON values, plain strings as
    they are)."""
    from draftsmith.demo_sizes import RECIPE

    train = {**RECIPE, "ttt_steps": a.ttt_steps, "epochs": a.epochs, "lr": a.lr, "eval_fraction": 0.0,
             "precision": a.precision, "draft_vocab_size": a.vocab, "batch_tokens": 4096, "num_layers": 1, "log_every": 20,
             "save_every": 100000, "eval_every": 100000}
    for kv in a.ours:
        key, _, value = kv.partition("=")
        try:
            train[key] = json.loads(value)
        except json.JSONDecodeError:
            train[key] = value
    return train


def train_ours(run: Path, work: Path, env: dict[str, str], config: dict, seed: int, logs: Path) -> Trained:
    """draftsmith's drafter on ``run``'s data and features (linked, not copied) at ``seed``, exported in the eagle3
    layout."""
    name = f"ours-seed-{seed}"
    mine = work / "runs" / name
    mine.mkdir(parents=True)
    for part in ("data", "features"):
        (mine / part).symlink_to((run / part).resolve())
    train = {**config, "seed": seed}
    env = {**env, "DRAFTSMITH_RUNS_DIR": str(work / "runs"),
           **{f"DRAFTSMITH_TRAIN__{k.upper()}": json.dumps(v) if not isinstance(v, str) else v
              for k, v in train.items()}}
    log = logs / f"train-draftsmith-seed-{seed}.log"
    t0 = time.perf_counter()
    _cli(["train", "--run", name], env, log)
    train_s = time.perf_counter() - t0
    _cli(["export", "--run", name, "--format", "eagle3"], env, logs / f"export-draftsmith-seed-{seed}.log")
    return Trained(seed, mine / "export" / "eagle3", train_s, log=str(log))


def _shape(run: Path) -> tuple[int, int]:
    """``(longest sample's tokens, samples)`` of ``run``'s data."""
    from draftsmith.drafter.data import TrainSamples

    samples = TrainSamples(run / "data").samples
    return max(int(s.input_ids.numel()) for s in samples.values()), len(samples)


# speculators' autocast dtype for each --precision
PEER_DTYPE = {"bf16": "bfloat16", "fp32": "float32"}


def peer_config(a, max_seq_len: int, samples: int) -> dict:
    """The peer's training settings as this comparison sets them: ``lr`` (None: speculators' default, 1e-3 for both
    its Muon and its AdamW groups), ``total_seq_len`` (``--peer-pack`` or the longest sample), ``loss_rows``
    (``all``: an all-ones loss mask; ``generated``: the run's mask), ``train_samples`` (every row but its last),
    ``hidden_states_dtype`` (its autocast dtype: ``bfloat16``, its default, or ``float32`` for ``--precision fp32``,
    where CPU autocast is off and it trains in float32) and the extra flags."""
    return {"lr": a.peer_lr, "total_seq_len": max(a.peer_pack, max_seq_len),
            "loss_rows": "all" if a.peer_all_rows else "generated", "train_samples": samples - 1,
            "hidden_states_dtype": PEER_DTYPE[a.precision], "extra": list(a.peer_arg), "speculators": "0.9.0"}


def train_peer(data: Path, target: Path, work: Path, config: dict, seed: int, a) -> Trained:
    """speculators' drafter at ``seed`` on the peer data ``data`` (``bench/peer_speculators.py``, in
    ``.peer-venv``); its training log is copied beside ``peer.json`` (``work/peer-train-seed-<seed>.log``)."""
    import peer_speculators as ps

    out = ps.train_peer(data, target, work / "peer-out" / f"seed-{seed}", epochs=a.epochs, draft_vocab_size=a.vocab,
                        ttt_steps=a.ttt_steps, lr=config["lr"], total_seq_len=config["total_seq_len"],
                        train_samples=config["train_samples"],
                        extra=["--seed", str(seed), "--hidden-states-dtype", config["hidden_states_dtype"],
                               *config["extra"]])
    log = work / f"peer-train-seed-{seed}.log"
    shutil.copyfile(out["log"], log)
    resolved = Path(out["drafter"]).parent / "run.yaml"  # speculators' resolved config, beside its checkpoints
    return Trained(seed, Path(out["drafter"]), float(out["wall_s"]), log=str(log),
                   resolved=resolved.read_text() if resolved.is_file() else None)


def conditions(a, data_hash: str, sets) -> dict:
    """What a peer side's counts depend on besides its own config: the data (SHA-256), epochs, draft vocabulary, K,
    TTT depth, seeds, prompts and tokens, vLLM's mode and concurrency, each set's file (SHA-256), and the machine's
    arithmetic (:func:`machine`)."""
    import hashlib

    return {"data_sha256": data_hash, "epochs": a.epochs, "draft_vocab_size": a.vocab, "k": a.k,
            "ttt_steps": a.ttt_steps, "seeds": list(range(a.seeds)), "prompts": a.prompts, "limit": a.limit,
            "max_tokens": a.max_tokens, "eager": a.eager, "concurrency": a.concurrency,
            "sets": {es.name: hashlib.sha256(es.path.read_bytes()).hexdigest() for es in sets},
            "machine": machine()}


def machine() -> dict:
    """What a seeded training's result depends on besides its inputs: torch's version and the CPU's bf16 kernels
    (``amx``, ``avx512_bf16`` or ``none``: they decide ``--precision auto`` and whether Muon's Newton-Schulz runs in
    bf16 or float32, so the same seed gives other weights where they differ). The CPU model is for the reader."""
    from importlib.metadata import version

    from draftsmith.precision import CPUINFO, cpu_has_amx, cpu_has_bf16_kernels

    try:
        info = Path(CPUINFO).read_text()
    except OSError:
        info = ""
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "")
    bf16 = "amx" if cpu_has_amx() else "avx512_bf16" if cpu_has_bf16_kernels() else "none"
    return {"torch": version("torch"), "bf16": bf16, "cpu": model}


def _side_json(side: Side) -> dict:
    return {"config": side.config, "runs": [{**vars(r), "drafter": str(r.drafter),
                                             "prompts": [vars(p) for p in r.prompts]} for r in side.runs]}


def save_record(path: Path, cond: dict, ours: Side, peer: Side) -> None:
    """Write ``peer.json``: the conditions, and both sides' resolved configs, drafters, training seconds and
    per-prompt counts per seed (the peer side is what a later ``--peer-from`` reuses)."""
    path.write_text(json.dumps({"schema": PEER_SCHEMA, "conditions": cond, "draftsmith": _side_json(ours),
                                "speculators": _side_json(peer)}, indent=1))


def _diff(recorded, wanted, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two JSON-like dicts (a key on one side only counts)."""
    if not (isinstance(recorded, dict) and isinstance(wanted, dict)):
        return [] if recorded == wanted else [prefix.rstrip(".")]
    out = []
    for key in sorted(set(recorded) | set(wanted)):
        out += _diff(recorded.get(key, "<absent>"), wanted.get(key, "<absent>"), f"{prefix}{key}.")
    return out


def peer_from(path: Path, cond: dict, config: dict, side: str = "speculators") -> Side:
    """The peer side (``side="draftsmith"``: draftsmith's side) a kept run of this bench measured (``--keep DIR``
    writes ``DIR/peer.json``), if it was measured under the same conditions and that side's config as this run.

    Raises:
        ValueError: the record is missing, of an older layout, or differs; the message names every differing key
            (e.g. ``conditions.data_sha256``, ``speculators.lr``) with both values.
    """
    if not path.is_file():
        raise ValueError(f"{path} does not exist: give --peer-from the DIR an earlier `--keep DIR` run wrote")
    rec = json.loads(path.read_text())
    if rec.get("schema") != PEER_SCHEMA:
        raise ValueError(f"{path} was written by an older bench/peer.py without its conditions: measure the peer "
                         "side again (drop --peer-from)")
    recorded = {"conditions": rec["conditions"], side: rec[side]["config"]}
    wanted = {"conditions": cond, side: config}
    differ = _diff(recorded, wanted)
    if differ:
        def at(d, key):
            for part in key.split("."):
                d = d.get(part, "<absent>") if isinstance(d, dict) else "<absent>"
            return d
        lines = "; ".join(f"{k}: recorded {at(recorded, k)!r}, now {at(wanted, k)!r}" for k in differ)
        flag = "--peer-from" if side == "speculators" else "--ours-from"
        raise ValueError(f"{path}: the {side} side was recorded under other settings ({lines}); rerun with the "
                         f"recorded settings or measure it again (drop {flag})")
    runs = [Trained(r["seed"], Path(r["drafter"]), float(r["train_s"]), [PromptCounts(**p) for p in r["prompts"]],
                    r.get("log"), r.get("resolved")) for r in rec[side]["runs"]]
    if not runs:
        raise ValueError(f"{path} holds no {side} side (a --only trial of the other side)")
    return Side(side, rec[side]["config"], runs)


TRAINING_CONDITIONS = ("data_sha256", "epochs", "draft_vocab_size", "ttt_steps", "machine")


def trained_before(dirs: list[Path], side: str, config: dict, cond: dict, seed: int,
                   logs: Path | None = None) -> Trained | None:
    """A drafter of ``side`` at ``seed`` that an earlier kept run (``DIR/peer.json`` of each of ``dirs``) trained
    with the same side config and :data:`TRAINING_CONDITIONS`, whose folder still exists; its prompts are left
    empty, to be measured again (on this run's prompts), and its training log is copied into ``logs``. None when
    no record has one. Training is seeded and reproduces to the digit on one kind of machine (docs/benchmarks.md),
    so this is the drafter a new training would give; one trained under other bf16 kernels or torch is not."""
    for d in dirs:
        rec = json.loads((d / "peer.json").read_text()) if (d / "peer.json").is_file() else None
        if not rec or rec.get("schema") != PEER_SCHEMA or rec[side]["config"] != config or \
                any(rec["conditions"].get(k) != cond[k] for k in TRAINING_CONDITIONS):
            continue
        for r in rec[side]["runs"]:
            if r["seed"] == seed and Path(r["drafter"]).is_dir():
                print(f"{side} seed {seed}: the drafter {d} trained, measured again", flush=True)
                log = r.get("log")
                if logs and log and Path(log).is_file() and Path(log).parent != logs:
                    log = str(shutil.copyfile(log, logs / Path(log).name))
                return Trained(seed, Path(r["drafter"]), float(r["train_s"]), log=log, resolved=r.get("resolved"))
    return None


def _only(counts: dict[int, list[PromptCounts]], set_name: str | None) -> dict[int, list[PromptCounts]]:
    """``counts`` cut to one set's prompts (None: all)."""
    return {s: [p for p in c if set_name is None or p.set == set_name] for s, c in counts.items()}


def report(ours: Side, peer: Side) -> None:
    """The per-side lines, then RATIO and INTERVAL (draftsmith over speculators) overall and per set."""
    names = list(dict.fromkeys(p.set for sd in (ours, peer) for r in sd.runs for p in r.prompts))
    for sd in (s for s in (ours, peer) if s.runs):
        pooled = [p for r in sd.runs for p in r.prompts]
        per_set = " ".join(f"{n} {acceptance_length([p for p in pooled if p.set == n]):.3f}" for n in names)
        seeds = " ".join(f"{r.seed}: {acceptance_length(r.prompts):.3f}" for r in sd.runs)
        train_s = sum(r.train_s for r in sd.runs) / len(sd.runs)
        print(f"{sd.name}: acceptance length {acceptance_length(pooled):.3f} ({per_set}); seeds {seeds}; "
              f"training {train_s:.0f} s per seed; drafters {', '.join(str(r.drafter) for r in sd.runs)}")
    if not (ours.runs and peer.runs):
        return  # one side only (--only): its trial's figures, no ratio
    for suffix, keep in [("", None)] + [(f"_{n}", n) for n in names]:
        ratio, low, high = seeded_ratio(_only(ours.counts(), keep), _only(peer.counts(), keep))
        print(f"RATIO peer_acceptance{suffix} {ratio:.3f}")
        print(f"INTERVAL peer_acceptance{suffix} {low:.3f} {high:.3f}")


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, help="a draftsmith run folder with data/ and features/ (e.g. runs/demo)")
    ap.add_argument("--quick", action="store_true", help="small, noisy, minutes: builds its own run")
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--seeds", type=int, help="training seeds per side, 0..N-1 for both trainers (default 3; --quick 1)")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--split", choices=["selection", "report"],
                       help="prompts 1-40 (choose on these) or 41-80 (report on these) of each bundled set")
    which.add_argument("--prompts", help="FIRST-LAST of each bundled set, 1-based, inclusive (default: report, 41-80)")
    ap.add_argument("--limit", type=int, help="at most this many prompts per set (default all; --quick 3)")
    ap.add_argument("--eval-sets", nargs="+", type=Path, default=[], metavar="FILE",
                    help="more prompt sets (JSONL, a 'turns' list per line, as the bundled ones): all their prompts")
    ap.add_argument("--max-tokens", type=int, help="new tokens per answer (default 128; --quick 32)")
    ap.add_argument("--k", type=int, default=3, help="speculative tokens per step")
    ap.add_argument("--ttt-steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-3, help="draftsmith's peak AdamW lr (its Muon lr is the recipe's)")
    ap.add_argument("--eager", action="store_true", help="vLLM without compilation (starts faster)")
    ap.add_argument("--concurrency", type=int, default=16,
                    help="prompts answered at once, each counted by vLLM's per-request metrics (default 16; 1: one "
                         "at a time, checked against the server's counters)")
    ap.add_argument("--only", choices=["draftsmith", "speculators"],
                    help="train and measure one side only (a side's tuning trials); no RATIO")
    ap.add_argument("--peer-data", type=Path, metavar="DIR",
                    help="keep the peer's hidden states here and reuse them when made from the same data and loss "
                         "rows (they take as long as one training)")
    ap.add_argument("--peer-states-from", type=Path, metavar="DIR",
                    help="a --peer-data folder made from the same data with the other loss rows: its hidden states "
                         "are linked, only the loss mask is written")
    ap.add_argument("--peer-lr", type=float, help="the peer's --lr (default its own, 1e-3)")
    ap.add_argument("--peer-pack", type=int, default=1024,
                    help="the peer's tokens per packed batch (its --total-seq-len; its own default is 8192)")
    ap.add_argument("--peer-all-rows", action="store_true", help="train the peer with an all-ones loss mask")
    ap.add_argument("--peer-arg", action="append", default=[], help="extra speculators train flag (repeatable)")
    ap.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                    help="both sides' training arithmetic: bf16 autocast (the peer's default) or float32; auto: bf16 "
                         "where the CPU has bf16 kernels (AMX or AVX-512-BF16), float32 where it has none (bf16 "
                         "matrix products there run ~100x slower than float32)")
    ap.add_argument("--keep", type=Path, help="keep the work folder here (drafters, logs, peer.json)")
    ap.add_argument("--ours", action="append", default=[], metavar="KEY=VALUE",
                    help="a draftsmith recipe variant: train.KEY=VALUE (repeatable), e.g. norm_output=true")
    ap.add_argument("--ours-from", type=Path, metavar="DIR",
                    help="reuse draftsmith's side of an earlier --keep DIR run (refused unless recorded under the "
                         "same conditions and draftsmith config), e.g. to train the peer once more with other rows")
    ap.add_argument("--trained-from", type=Path, nargs="+", default=[], metavar="DIR",
                    help="earlier --keep DIRs: a side's seed they trained under the same data, epochs, vocabulary, "
                         "TTT depth and side config is measured again instead of trained again")
    ap.add_argument("--peer-from", type=Path, metavar="DIR",
                    help="reuse the peer side of an earlier --keep DIR run (refused unless recorded under the same "
                         "data, epochs, vocabulary, K, seeds, prompts and peer settings)")
    a = ap.parse_args()
    if not a.run and not a.quick:
        ap.error("give --run RUN_DIR (a run with data/ and features/) or --quick")
    try:
        lo, hi = prompt_range(a.prompts or a.split or "report")
    except ValueError as e:
        ap.error(str(e))
    a.prompts = f"{lo + 1}-{hi}"  # one spelling in the record, whichever flag named the range
    a.epochs = a.epochs or (1 if a.quick else 2)
    a.seeds = a.seeds or (1 if a.quick else 3)
    a.limit = a.limit or (3 if a.quick else None)
    a.max_tokens = a.max_tokens or (32 if a.quick else 128)
    a.eager = a.eager or a.quick
    if a.precision == "auto":
        a.precision = "fp32" if machine()["bf16"] == "none" else "bf16"
    return a


def main() -> None:
    a = _args()
    from draftsmith.config import load_settings
    from draftsmith.errors import DataError
    from draftsmith.target.embedded import embedded_dir

    try:
        sets = eval_sets(a.eval_sets, prompt_range(a.prompts), a.limit)
    except (DataError, ValueError) as e:
        raise SystemExit(f"--eval-sets: {e}") from e
    held = [d for d in ("runs", "peer-out") if a.keep and (a.keep / d).exists()]
    if held:  # a kept run's drafters are never trained over
        raise SystemExit(f"--keep {a.keep} already holds an earlier run's {' and '.join(held)}: give a new folder "
                         f"(to measure its drafters again: --trained-from {a.keep} --keep NEW)")
    # the peer's own virtualenv, built once by the repository's script (a no-op when it is there)
    subprocess.run(["bash", str(REPO / "scripts" / "peer-venv.sh")], check=True)
    target = embedded_dir(load_settings().target.cache_dir)
    work = a.keep or Path(tempfile.mkdtemp(prefix="bench-peer-"))
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DRAFTSMITH_TARGET__PATH": str(target)}
    try:
        if a.quick:
            qenv = {**env, "DRAFTSMITH_RUNS_DIR": str(work / "quick-runs"), "DRAFTSMITH_DATA__DRAFT_VOCAB_SIZE": "1024",
                    "DRAFTSMITH_DATA__MAX_LENGTH": "512"}
            run = quick_run(work / "quick-runs", target, 48, qenv, logs)
        else:
            run = a.run.resolve()
        vocabs = mapping_sizes(run / "data" / "vocab")
        if not vocabs:
            raise SystemExit(f"{run}/data/vocab has no draft vocabulary: run `draftsmith build-data` first")
        a.vocab = vocabs[-1]
        cond = conditions(a, data_sha256(run / "data"), sets)
        print(f"data: {run} (sha256 {cond['data_sha256'][:12]}); draft vocabulary {a.vocab}; {a.epochs} epoch(s); "
              f"TTT depth {a.ttt_steps}; seeds {cond['seeds']}; prompts {a.prompts} of each bundled set"
              f"{f' (at most {a.limit})' if a.limit else ''}, sets {', '.join(cond['sets'])}; {a.max_tokens} tokens, "
              f"K {a.k}; training in {a.precision} on both sides", flush=True)
        config = peer_config(a, *_shape(run))
        reused = _reused_peer(a, cond, config, work) if a.peer_from else None  # refused before anything trains
        ours = Side("draftsmith", ours_config(a))
        if a.ours_from:
            try:
                ours = peer_from(a.ours_from / "peer.json", cond, ours.config, side="draftsmith")
            except ValueError as e:
                raise SystemExit(f"--ours-from: {e}") from e
        for seed in cond["seeds"] if a.only != "speculators" and not a.ours_from else []:
            ours.runs.append(trained_before(a.trained_from, "draftsmith", ours.config, cond, seed, logs)
                             or train_ours(run, work, env, ours.config, seed, logs))
            ours.runs[-1].prompts = _measure(ours.runs[-1].drafter, target, sets, a, logs / f"vllm-ours-{seed}.log")
        peer = Side("speculators", config) if a.only == "draftsmith" else \
            reused or _peer_side(a, run, target, work, sets, cond, config, logs)
        save_record(work / "peer.json", cond, ours, peer)
        report(ours, peer)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


def _measure(drafter: Path, target: Path, sets, a, log: Path) -> list[PromptCounts]:
    """One EAGLE-3 drafter (either side's: vLLM reads both layouts) on ``sets`` (already cut to their prompts)."""
    return measure_in_vllm({"method": "eagle3", "model": str(drafter), "num_speculative_tokens": a.k}, target, sets,
                           (0, max(len(es.prompts) for es in sets)), a.max_tokens, a.eager, log,
                           concurrency=a.concurrency)


def _reused_peer(a, cond: dict, config: dict, work: Path) -> Side:
    """The peer side of ``--peer-from DIR``, checked before anything trains; its kept training logs are copied into
    ``work`` beside the new record. Raises SystemExit naming the settings that differ."""
    try:
        peer = peer_from(a.peer_from / "peer.json", cond, config)
    except ValueError as e:
        raise SystemExit(f"--peer-from: {e}") from e
    for r in peer.runs:
        if r.log and Path(r.log).is_file() and Path(r.log).parent != work:
            shutil.copyfile(r.log, work / Path(r.log).name)
            r.log = str(work / Path(r.log).name)
    return peer


def _peer_side(a, run: Path, target: Path, work: Path, sets, cond: dict, config: dict, logs: Path) -> Side:
    """The peer side trained per seed on its own hidden states of ``run``'s samples, and measured."""
    import peer_speculators as ps

    t0 = time.perf_counter()
    data = a.peer_data or work / "peer-data"
    key = {"data_sha256": cond["data_sha256"], "loss_rows": config["loss_rows"]}
    if (data / "draftsmith-key.json").is_file() and json.loads((data / "draftsmith-key.json").read_text()) == key:
        made = json.loads((data / "peer.json").read_text())
        print(f"peer data: reused {data}", flush=True)
    else:
        (data / "draftsmith-key.json").unlink(missing_ok=True)  # a half-rewritten folder is never reused
        states = a.peer_states_from
        if states and json.loads((states / "draftsmith-key.json").read_text())["data_sha256"] == key["data_sha256"]:
            made = ps.relabel_peer_data(states, run, data, all_rows=a.peer_all_rows)
        elif states:
            raise SystemExit(f"--peer-states-from {states}: its hidden states were made from other data than {run}")
        else:
            made = ps.write_peer_data(run, target, data, all_rows=a.peer_all_rows)
        (data / "draftsmith-key.json").write_text(json.dumps(key))
    print(f"peer data: {made['samples']} samples, {made['tokens']} tokens, loss rows {config['loss_rows']} "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)
    peer = Side("speculators", config)
    for seed in cond["seeds"]:
        peer.runs.append(trained_before(a.trained_from, "speculators", config, cond, seed, work)
                         or train_peer(data, target, work, config, seed, a))
        print(f"peer training log (seed {seed}): {peer.runs[-1].log}", flush=True)
        peer.runs[-1].prompts = _measure(peer.runs[-1].drafter, target, sets, a, logs / f"vllm-peer-{seed}.log")
    return peer


if __name__ == "__main__":
    main()
