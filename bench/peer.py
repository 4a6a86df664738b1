"""draftsmith's drafter against the peer trainer's (speculators), trained on the same data and measured in vLLM.

Both sides get the same samples (a draftsmith run's ``data/``: token ids and loss masks of the regenerated
conversations), the same drafter shape (one decoder layer), the same TTT depth, the same draft vocabulary size and
the same number of epochs, under the same bf16 autocast (the peer's trainer always runs under it). draftsmith
trains with its demo recipe (``draftsmith.demo_sizes.RECIPE``, the learning rate of the demo size the data come from)
on its stored features; speculators trains with its own defaults in its own virtualenv (``scripts/peer-venv.sh``;
the CPU patches are listed there), on hidden states made for it by ``bench/peer_speculators.py`` (the same aux
layers, the last layer before the final norm, the same d2t/t2d), in packs of 1,024 tokens, on every sample but one
(its trainer always keeps its last rows for validation). Each drafter is then served by vLLM CPU beside the embedded
target (K speculative tokens, temperature 0) and answers the same prompts of every bundled set one at a time, so that
vLLM's counters give each prompt's drafts and accepted tokens.

Prints per side: mean acceptance length overall and per set, training wall time; then
``RATIO peer_acceptance <draftsmith / speculators>`` (the ratio of the overall mean acceptance lengths) and
``INTERVAL peer_acceptance <low> <high>``: a 95 % paired bootstrap over prompts (``scipy.stats.bootstrap``).

    .venv/bin/python bench/peer.py --run runs/demo [--epochs 2 --limit 40 --max-tokens 128]
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from protocol import PromptCounts, acceptance_length, measure_in_vllm, seeded_ratio  # noqa: E402

RECORD_SCHEMA = "draftsmith.record/1"
SETS = ("mt_bench", "gsm8k", "humaneval", "alpaca")


@dataclass
class Side:
    """One drafter's training time and per-prompt counts."""

    name: str
    drafter: Path
    train_s: float
    prompts: list[PromptCounts] = field(default_factory=list)


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


def train_ours(run: Path, work: Path, env: dict[str, str], a, logs: Path) -> Side:
    """draftsmith's drafter on ``run``'s data and features (linked, not copied), exported in the eagle3 layout."""
    from draftsmith.demo_sizes import RECIPE

    mine = work / "runs" / "ours"
    mine.mkdir(parents=True)
    for part in ("data", "features"):
        (mine / part).symlink_to((run / part).resolve())
    # bf16 autocast, as the peer's trainer always runs (its CPU patch 2): the same arithmetic on both sides, whatever
    # draftsmith's precision rule picks on this CPU
    train = {**RECIPE, "ttt_steps": a.ttt_steps, "epochs": a.epochs, "lr": a.lr, "eval_fraction": 0.0,
             "precision": "bf16", "draft_vocab_size": a.vocab, "batch_tokens": 4096, "num_layers": 1, "log_every": 20,
             "save_every": 100000, "eval_every": 100000}
    for kv in a.ours:  # a variant of the recipe: train.KEY=VALUE (JSON values; plain strings as they are)
        key, _, value = kv.partition("=")
        try:
            train[key] = json.loads(value)
        except json.JSONDecodeError:
            train[key] = value
    env = {**env, "DRAFTSMITH_RUNS_DIR": str(work / "runs"),
           **{f"DRAFTSMITH_TRAIN__{k.upper()}": json.dumps(v) if not isinstance(v, str) else v
              for k, v in train.items()}}
    t0 = time.perf_counter()
    _cli(["train", "--run", "ours"], env, logs / "train-draftsmith.log")
    train_s = time.perf_counter() - t0
    _cli(["export", "--run", "ours", "--format", "eagle3"], env, logs / "export-draftsmith.log")
    return Side("draftsmith", mine / "export" / "eagle3", train_s)


def train_peer(run: Path, target: Path, work: Path, a) -> Side:
    """speculators' drafter on the same samples (``bench/peer_speculators.py``, in ``.peer-venv``)."""
    import peer_speculators as ps

    data = work / "peer-data"
    t0 = time.perf_counter()
    made = ps.write_peer_data(run, target, data)
    print(f"peer data: {made}", flush=True)
    # packs of 1,024 tokens (or the longest sample), as its CLI sizes them: its 8,192-token default trains ~4x
    # slower on a CPU; every row but the last trains (speculators always validates on its last rows)
    out = ps.train_peer(data, target, work / "peer-out", epochs=a.epochs, draft_vocab_size=a.vocab,
                        ttt_steps=a.ttt_steps, total_seq_len=max(1024, made["max_seq_len"]),
                        train_samples=made["samples"] - 1, extra=list(a.peer_arg))
    print(f"peer training log: {out['log']} (data and training {time.perf_counter() - t0:.0f} s)", flush=True)
    return Side("speculators", Path(out["drafter"]), float(out["wall_s"]))


def measure(side: Side, target: Path, sets, a, logs: Path) -> None:
    """Serve ``side``'s drafter in vLLM CPU and answer the first ``a.limit`` prompts of every set alone."""
    side.prompts += measure_in_vllm({"method": "eagle3", "model": str(side.drafter), "num_speculative_tokens": a.k},
                                    target, sets, (0, a.limit), a.max_tokens, a.eager, logs / f"vllm-{side.name}.log")


def save_peer(side: Side, path: Path) -> None:
    """Write the peer side (drafter, training seconds, per-prompt counts) for a later ``--peer-from``."""
    path.write_text(json.dumps({"drafter": str(side.drafter), "train_s": side.train_s,
                                "prompts": [vars(p) for p in side.prompts]}))


def peer_from(path: Path) -> Side:
    """The peer side a kept run of this bench measured (``--keep DIR`` writes ``DIR/peer.json``)."""
    d = json.loads(path.read_text())
    return Side("speculators", Path(d["drafter"]), float(d["train_s"]), [PromptCounts(**p) for p in d["prompts"]])


def report(sides: list[Side]) -> None:
    """The per-side lines, then RATIO and INTERVAL (draftsmith over speculators)."""
    for sd in sides:
        per_set = {n: acceptance_length([p for p in sd.prompts if p.set == n])
                   for n in dict.fromkeys(p.set for p in sd.prompts)}
        sets = " ".join(f"{n} {v:.3f}" for n, v in per_set.items())
        print(f"{sd.name}: acceptance length {acceptance_length(sd.prompts):.3f} ({sets}); "
              f"training {sd.train_s:.0f} s; drafter {sd.drafter}")
    ratio, low, high = seeded_ratio({0: sides[0].prompts}, {0: sides[1].prompts})
    print(f"RATIO peer_acceptance {ratio:.3f}")
    print(f"INTERVAL peer_acceptance {low:.3f} {high:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, help="a draftsmith run folder with data/ and features/ (e.g. runs/demo)")
    ap.add_argument("--quick", action="store_true", help="small, noisy, minutes: builds its own run")
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--limit", type=int, help="prompts per bundled set (default 40; --quick 3)")
    ap.add_argument("--max-tokens", type=int, help="new tokens per answer (default 128; --quick 32)")
    ap.add_argument("--k", type=int, default=3, help="speculative tokens per step")
    ap.add_argument("--ttt-steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-3, help="draftsmith's peak lr (the default demo's)")
    ap.add_argument("--eager", action="store_true", help="vLLM without compilation (starts faster)")
    ap.add_argument("--peer-arg", action="append", default=[], help="extra speculators train flag (repeatable)")
    ap.add_argument("--keep", type=Path, help="keep the work folder here (drafters, logs, peer.json)")
    ap.add_argument("--ours", action="append", default=[], metavar="KEY=VALUE",
                    help="a draftsmith recipe variant: train.KEY=VALUE (repeatable), e.g. norm_output=true")
    ap.add_argument("--peer-from", type=Path, metavar="DIR",
                    help="reuse the peer measured by an earlier --keep DIR run (same run, epochs and prompts)")
    a = ap.parse_args()
    if not a.run and not a.quick:
        ap.error("give --run RUN_DIR (a run with data/ and features/) or --quick")
    a.epochs = a.epochs or (1 if a.quick else 2)
    a.limit = a.limit or (3 if a.quick else 40)
    a.max_tokens = a.max_tokens or (32 if a.quick else 128)
    a.eager = a.eager or a.quick

    from draftsmith.config import load_settings
    from draftsmith.evaluation.sets import load_set
    from draftsmith.target.embedded import embedded_dir

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
        vocabs = sorted(int(p.stem.split("-")[1]) for p in (run / "data" / "vocab").glob("draft-*.safetensors"))
        if not vocabs:
            raise SystemExit(f"{run}/data/vocab has no draft vocabulary: run `draftsmith build-data` first")
        a.vocab = vocabs[-1]
        sets = [load_set(n, limit=a.limit) for n in SETS]
        print(f"data: {run}; draft vocabulary {a.vocab}; {a.epochs} epoch(s); TTT depth {a.ttt_steps}; "
              f"{a.limit} prompts per set, {a.max_tokens} tokens, K {a.k}", flush=True)
        ours = train_ours(run, work, env, a, logs)
        measure(ours, target, sets, a, logs)
        if a.peer_from:  # the peer as measured before on the same run, settings and prompts
            peer = peer_from(a.peer_from / "peer.json")
        else:
            peer = train_peer(run, target, work, a)
            measure(peer, target, sets, a, logs)
        save_peer(peer, work / "peer.json")
        report([ours, peer])
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
