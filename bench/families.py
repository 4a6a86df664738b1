"""Drafter families side by side: EAGLE-3, P-EAGLE and DFlash trained on the same run's data, served in vLLM CPU.

Each family (``train.family``; :func:`draftsmith.drafter.families.get_family`) is trained with the CLI
(``draftsmith train`` / ``export``, the run keys set through ``DRAFTSMITH_TRAIN__*``) on the same data and features
(linked, not copied), once per seed, then served by vLLM CPU beside the embedded target at the K it is meant for
(:data:`DEFAULT_K`: a chain of 3 for EAGLE-3, K tokens from one pass for P-EAGLE, a block of K masks for DFlash;
``--k family=K`` overrides; the drafter is trained with ``train.ttt_steps = K``). Every prompt of the split answers
alone, greedy, through the family's ``speculative_config``; vLLM's counters give its drafts and accepted tokens and
the wall clock its seconds. The target alone is served once with the same flags (drafter off) and answers the same
prompts: speedup = (output tokens / s with the drafter) / (output tokens / s alone), over all prompts of a seed.

Prints per family ``ACCEPT <family> <set> <mean acceptance length>`` (all seeds pooled), ``SPEEDUP <family> <x>``
(the mean over seeds) and ``RATIO family_speedup_<family> <speedup / eagle3's speedup>`` with
``INTERVAL family_speedup_<family> <low> <high>``: a 95 % bootstrap over seeds and prompts (both resampled, the
prompts paired across families); then ``RATIO family_acceptance_<family>`` and its ``INTERVAL``: the mean acceptance
length over eagle3's (``bench/protocol.py``'s ``seeded_ratio``). The prompts, the split (1-40 to select or tune, 41-80
to report) and the counters follow ``bench/protocol.py``; speedup needs the wall clock and the target alone, so the
serving loop here times each prompt and also runs without a drafter.

    .venv/bin/python bench/families.py --quick --seeds 2 --limit 5 --max-tokens 64      (its own small run)
    .venv/bin/python bench/families.py --run runs/demo --split report --families eagle3 --reuse DIR
    .venv/bin/python bench/families.py --run runs/demo --reuse DIR --families peagle,dflash   (adds to DIR)

``--reuse DIR`` keeps the work folder and skips what it already holds (a trained export, a measured family and
seed, the measured target): one family per command keeps each under a time limit.
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
from dataclasses import asdict, dataclass
from pathlib import Path

from draftsmith.artifacts.vocab import mapping_sizes

sys.path.insert(0, str(Path(__file__).resolve().parent))

from protocol import SPLITS, PromptCounts, acceptance_length, eval_sets, prompt_range, seeded_ratio  # noqa: E402

BASE = "eagle3"
# K each family is meant for: EAGLE-3 a chain of 3 (its demo recipe's TTT depth); P-EAGLE and DFlash draft K tokens
# in one pass, so they are served at larger K (DFlash's paper uses blocks of 16; 8 keeps the verify step of a
# 2-core CPU affordable)
DEFAULT_K = {"eagle3": 3, "peagle": 5, "dflash": 7}
# recipe keys a family refuses (DFlash: EAGLE-3's norm flags and a loss over every row)
REFUSED = {"dflash": ("norm_before_residual", "fc_norm", "norm_before_fc", "norm_output", "loss_rows")}


@dataclass
class PromptTiming(PromptCounts):
    """One prompt's turns answered alone: vLLM's speculative counters around it (:class:`protocol.PromptCounts`;
    zero with the drafter off), its output ``tokens`` and wall-clock ``seconds``."""

    tokens: int
    seconds: float


def speedup(ours: list[PromptTiming], alone: list[PromptTiming]) -> float:
    """Output tokens per second with the drafter over the target alone's, on the same prompts.

    Raises:
        ValueError: the two answered different prompts.
    """
    if [(p.set, p.id) for p in ours] != [(p.set, p.id) for p in alone]:
        raise ValueError("the drafter and the target alone answered different prompts")
    return (sum(p.tokens for p in ours) / sum(p.seconds for p in ours)) / (
        sum(p.tokens for p in alone) / sum(p.seconds for p in alone))


def seeded_speedup_ratio(ours: list[list[PromptTiming]], base: list[list[PromptTiming]], alone: list[PromptTiming],
                 resamples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """``speedup(ours) / speedup(base)``, each the mean over its seeds, and its 95 % percentile interval from a
    bootstrap that resamples the seeds of each side and the prompts (one draw of prompt indices for both sides and
    the target alone, so the comparison stays paired).

    Args:
        ours, base: per seed, the per-prompt timings of the two families (the same prompts in the same order).
        alone: the target alone's timings of those prompts.

    Raises:
        ValueError: a side has no seed, or the prompts differ.
    """
    import numpy as np

    if not ours or not base:
        raise ValueError("each family needs at least one measured seed")

    def cols(side):  # [S, P] tokens and seconds
        return (np.array([[p.tokens for p in s] for s in side], float),
                np.array([[p.seconds for p in s] for s in side], float))

    for s in (*ours, *base):
        speedup(s, alone)  # raises on other prompts
    (ot, os_), (bt, bs) = cols(ours), cols(base)
    at, as_ = cols([alone])

    def ratio(oi, bi, pi):  # seed indices of each side, prompt indices
        alone_tps = at[0, pi].sum() / as_[0, pi].sum()
        o = np.mean([ot[s, pi].sum() / os_[s, pi].sum() for s in oi]) / alone_tps
        b = np.mean([bt[s, pi].sum() / bs[s, pi].sum() for s in bi]) / alone_tps
        return o / b

    n = at.shape[1]
    point = float(ratio(range(len(ours)), range(len(base)), np.arange(n)))
    rng = np.random.default_rng(seed)
    draws = [ratio(rng.integers(0, len(ours), len(ours)), rng.integers(0, len(base), len(base)),
                   rng.integers(0, n, n)) for _ in range(resamples)]
    low, high = np.percentile(draws, [2.5, 97.5])
    return point, float(low), float(high)


def report(measured: dict[str, list[list[PromptTiming]]], alone: list[PromptTiming]) -> list[str]:
    """The lines the bench prints: ``ACCEPT`` per family and set, ``SPEEDUP`` per family, then ``RATIO`` and
    ``INTERVAL`` of each family's speedup over :data:`BASE`'s (when it was measured).

    Args:
        measured: family -> per seed, its per-prompt timings (the prompts of ``alone``, in order).
        alone: the target alone's timings.
    """
    lines = []
    for fam, seeds in measured.items():
        pooled = [p for s in seeds for p in s]
        for name in dict.fromkeys(p.set for p in pooled):
            lines.append(f"ACCEPT {fam} {name} {acceptance_length([p for p in pooled if p.set == name]):.3f}")
        lines.append(f"ACCEPT {fam} all {acceptance_length(pooled):.3f}")
        mean = sum(speedup(s, alone) for s in seeds) / len(seeds)
        lines.append(f"SPEEDUP {fam} {mean:.3f} ({len(seeds)} seed(s))")
    if BASE in measured:
        for fam, seeds in measured.items():
            point, low, high = seeded_speedup_ratio(seeds, measured[BASE], alone)
            lines.append(f"RATIO family_speedup_{fam} {point:.3f}")
            lines.append(f"INTERVAL family_speedup_{fam} {low:.3f} {high:.3f}")
            point, low, high = seeded_ratio(dict(enumerate(seeds)), dict(enumerate(measured[BASE])))
            lines.append(f"RATIO family_acceptance_{fam} {point:.3f}")
            lines.append(f"INTERVAL family_acceptance_{fam} {low:.3f} {high:.3f}")
    return lines


def _cli(args: list[str], env: dict[str, str], log: Path) -> str:
    """``draftsmith <args>``; its stdout (stderr to ``log``). Raises SystemExit with the log's tail on failure."""
    with log.open("a") as f:
        p = subprocess.run([sys.executable, "-m", "draftsmith", *args], env=env, stdout=subprocess.PIPE, stderr=f,
                           text=True, timeout=4 * 3600)
    if p.returncode != 0:
        raise SystemExit(f"draftsmith {' '.join(args)} failed ({p.returncode}); log {log}:\n{log.read_text()[-3000:]}")
    return p.stdout


def train_family(fam: str, k: int, seed: int, run: Path, work: Path, env: dict[str, str], a) -> Path:
    """Train family ``fam`` (``train.ttt_steps = k``, ``train.seed = seed``) on ``run``'s data and features with the
    CLI and export it; the export folder (kept and reused when ``work`` already holds it)."""
    from draftsmith.demo_sizes import RECIPE

    name = f"{fam}-s{seed}"
    done = work / f"{name}.export"
    if done.is_file():
        return Path(done.read_text().strip())
    mine = work / "runs" / name
    mine.mkdir(parents=True, exist_ok=True)
    for part in ("data", "features"):
        if not (mine / part).exists():
            (mine / part).symlink_to((run / part).resolve())
    train = {k_: v for k_, v in RECIPE.items() if k_ not in REFUSED.get(fam, ())}
    train.update({"family": fam, "ttt_steps": k, "seed": seed, "epochs": a.epochs, "lr": a.lr, "eval_fraction": 0.0,
                  "draft_vocab_size": a.vocab, "batch_tokens": 4096, "num_layers": 1, "log_every": 20,
                  "save_every": 100000, "eval_every": 100000})
    env = {**env, "DRAFTSMITH_RUNS_DIR": str(work / "runs"),
           **{f"DRAFTSMITH_TRAIN__{k_.upper()}": v if isinstance(v, str) else json.dumps(v)
              for k_, v in train.items()}}
    t0 = time.perf_counter()
    _cli(["train", "--run", name], env, work / "logs" / f"train-{name}.log")
    print(f"trained {name} (K {k}) in {time.perf_counter() - t0:.0f} s", flush=True)
    fmt = "both" if fam == "dflash" else "eagle3"  # dflash writes its own layout under either; eagle3's keeps one
    out = [line for line in _cli(["export", "--run", name, "--format", fmt], env,
                                 work / "logs" / f"export-{name}.log").splitlines() if line.strip()]
    drafter = Path(out[0].strip())
    done.write_text(str(drafter))
    return drafter


def measure(target: Path, speculative: dict | None, sets, a, log: Path) -> list[PromptTiming]:
    """Serve the target (with ``speculative``, or alone) in vLLM CPU and answer every prompt of ``sets`` alone,
    greedy, timing each and reading the counters around it. One untimed warm-up answer first."""
    from draftsmith.config import load_settings
    from draftsmith.evaluation.runner import VLLMClient
    from draftsmith.target.server import VLLMServer, VLLMServerSpec, free_port

    s = load_settings()
    spec = VLLMServerSpec(model=target, served_name=target.name, port=free_port(), dtype=s.target.dtype,
                          max_model_len=2048, kv_cache_gib=2, enforce_eager=a.eager, max_num_seqs=1,
                          speculative=speculative)
    out = []
    with VLLMServer(spec, log).start(timeout_s=1800) as server:
        client = VLLMClient(server.url, target.name)
        client.generate([{"role": "user", "content": sets[0].prompts[0].turns[0]}], a.max_tokens, 0.0)
        for es in sets:
            for p in es.prompts:
                before = client.counters()
                messages: list[dict[str, str]] = []
                tokens, t0 = 0, time.perf_counter()
                for user in p.turns:
                    messages.append({"role": "user", "content": user})
                    t = client.generate(messages, a.max_tokens, 0.0)
                    tokens += t.completion_tokens
                    messages.append({"role": "assistant", "content": t.text})
                seconds = time.perf_counter() - t0
                d = client.counters() - before
                out.append(PromptTiming(es.name, p.id, d.drafts, d.accepted, tokens, seconds))
    return out


def _cached(path: Path, make) -> list[PromptTiming]:
    """The timings stored at ``path``, else ``make()``'s, stored there."""
    if path.is_file():
        return [PromptTiming(**p) for p in json.loads(path.read_text())]
    got = make()
    path.write_text(json.dumps([asdict(p) for p in got]))
    return got


def parse_k(items: list[str]) -> dict[str, int]:
    """``["dflash=15"]`` over :data:`DEFAULT_K`. Raises SystemExit on a malformed item or an unknown family."""
    ks = dict(DEFAULT_K)
    for item in items:
        fam, _, val = item.partition("=")
        if fam not in ks or not val.isdigit() or int(val) < 1:
            raise SystemExit(f"--k {item!r}: give FAMILY=K with FAMILY one of {', '.join(ks)} and K >= 1")
        ks[fam] = int(val)
    return ks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, help="a draftsmith run folder with data/ and features/ (e.g. runs/demo)")
    ap.add_argument("--quick", action="store_true", help="build a small run of GSM8K reference answers first")
    ap.add_argument("--families", default="eagle3,peagle,dflash", help="comma-separated train.family values")
    ap.add_argument("--k", action="append", default=[], metavar="FAMILY=K", help="K of a family (repeatable)")
    ap.add_argument("--seeds", type=int, default=2, help="training seeds per family (train.seed 0..N-1)")
    ap.add_argument("--split", choices=sorted(SPLITS), default="report", help="prompts 1-40 (selection) or 41-80")
    ap.add_argument("--limit", type=int, default=10, help="prompts per bundled set, from the split's first")
    ap.add_argument("--max-tokens", type=int, default=64, help="new tokens per answer")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3, help="peak lr")
    ap.add_argument("--eager", action="store_true", help="vLLM without compilation (starts faster)")
    ap.add_argument("--reuse", type=Path, metavar="DIR", help="keep the work folder here; reuse what it holds")
    a = ap.parse_args()
    if not a.run and not a.quick:
        ap.error("give --run RUN_DIR (a run with data/ and features/) or --quick")
    ks = parse_k(a.k)
    fams = [f.strip() for f in a.families.split(",") if f.strip()]

    from draftsmith.config import load_settings
    from draftsmith.drafter.families import get_family
    from draftsmith.target.embedded import embedded_dir

    families = {f: get_family(f) for f in fams}  # an unknown family is refused before anything runs
    target = embedded_dir(load_settings().target.cache_dir)
    work = a.reuse or Path(tempfile.mkdtemp(prefix="bench-families-"))
    (work / "logs").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DRAFTSMITH_TARGET__PATH": str(target)}
    try:
        bench(a, fams, families, ks, target, work, env)
    finally:
        if not a.reuse:
            shutil.rmtree(work, ignore_errors=True)


def bench(a, fams: list[str], families: dict, ks: dict[str, int], target: Path, work: Path,
          env: dict[str, str]) -> None:
    """Build or find the run, measure the target alone and every family and seed, print :func:`report`."""
    if a.quick:
        import peer

        run = work / "quick-runs" / "quick"
        if not (run / "features").is_dir():
            qenv = {**env, "DRAFTSMITH_RUNS_DIR": str(work / "quick-runs"), "DRAFTSMITH_DATA__DRAFT_VOCAB_SIZE": "1024",
                    "DRAFTSMITH_DATA__MAX_LENGTH": "512"}
            run = peer.quick_run(work / "quick-runs", target, 48, qenv, work / "logs")
    else:
        run = a.run.resolve()
    vocabs = mapping_sizes(run / "data" / "vocab")
    if not vocabs:
        raise SystemExit(f"{run}/data/vocab has no draft vocabulary: run `draftsmith build-data` first")
    a.vocab = vocabs[-1]
    lo, hi = prompt_range(a.split)
    sets = eval_sets([], (lo, hi), a.limit)
    print(f"data: {run}; work {work}; families {fams} at K {[ks[f] for f in fams]}; {a.seeds} seed(s); "
          f"prompts {lo + 1}-{lo + a.limit} ({a.split}) of {len(sets)} sets, {a.max_tokens} tokens", flush=True)

    tag = f"{a.split}-{a.limit}-{a.max_tokens}-{'eager' if a.eager else 'compiled'}"
    alone = _cached(work / f"alone-{tag}.json",
                    lambda: measure(target, None, sets, a, work / "logs" / "vllm-alone.log"))
    for seed in range(a.seeds):  # seed by seed: a command stopped early still leaves every family measured once
        for fam, family in families.items():
            drafter = train_family(fam, ks[fam], seed, run, work, env, a)
            sc = family.speculative_config(drafter, ks[fam])
            _cached(work / f"{fam}-s{seed}-{tag}.json",
                    lambda sc=sc, n=f"{fam}-s{seed}": measure(target, sc, sets, a, work / "logs" / f"vllm-{n}.log"))
    # every family measured so far in this folder, so a per-family command still prints the ratios
    measured: dict[str, list[list[PromptTiming]]] = {}
    for fam in DEFAULT_K:
        for seed in range(a.seeds):
            path = work / f"{fam}-s{seed}-{tag}.json"
            if path.is_file():
                measured.setdefault(fam, []).append(_cached(path, list))
    for line in report(measured, alone):
        print(line, flush=True)


if __name__ == "__main__":
    main()
