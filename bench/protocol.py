"""The fair-comparison protocol's parts shared by the drafter benchmarks: per-prompt counts from vLLM, the mean
acceptance length, the selection/report prompt split, the seed-and-prompt bootstrap of a ratio, and one drafter
measured in vLLM CPU under any speculative config.

A library for ``bench/peer.py`` and the other drafter comparisons, not a benchmark of its own: run as a script it
prints the split, or measures one drafter at several concurrencies on the same prompts (how far batching moves the
per-prompt counts).

    .venv/bin/python bench/protocol.py      (the prompt ranges of the selection and report splits)
    .venv/bin/python bench/protocol.py --drafter DIR --concurrency 1 16 --prompts 1-10
                                            (one drafter measured one prompt at a time and 16 at a time)
"""

from __future__ import annotations

import argparse
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

# Prompts of each bundled set (80 each) used to choose anything (learning rates, recipes, pack sizes) against
# prompts that only report: choosing on the prompts that report a result biases it upwards.
SPLITS = {"selection": "1-40", "report": "41-80"}
BUNDLED = ("mt_bench", "gsm8k", "humaneval", "alpaca")


@dataclass
class PromptCounts:
    """vLLM's speculative counters over one prompt's turns: ``drafts`` (draft proposals, one per verify step) and
    ``accepted`` (draft tokens the target accepted)."""

    set: str
    id: str
    drafts: float
    accepted: float


def acceptance_length(prompts: list[PromptCounts]) -> float:
    """Mean acceptance length as vLLM reports it: ``1 + accepted / drafts`` over all the prompts (the bonus token
    included). Raises ValueError when nothing was drafted."""
    drafts = sum(p.drafts for p in prompts)
    if drafts <= 0:
        raise ValueError("no draft was proposed: was the drafter loaded?")
    return 1.0 + sum(p.accepted for p in prompts) / drafts


def prompt_range(text: str) -> tuple[int, int]:
    """``"41-80"`` (1-based, both ends included) as the 0-based half-open ``(40, 80)``; a split name of
    :data:`SPLITS` (``selection``, ``report``) as its range.

    Raises:
        ValueError: neither a split name nor ``FIRST-LAST`` with 1 <= FIRST <= LAST.
    """
    text = SPLITS.get(text.strip(), text.strip())
    m = re.fullmatch(r"(\d+)\s*-\s*(\d+)", text)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ValueError(f"prompt range {text!r} is neither FIRST-LAST (1-based, inclusive, e.g. 41-80) nor a split "
                         f"name ({', '.join(f'{k} = {v}' for k, v in SPLITS.items())})")
    return int(m.group(1)) - 1, int(m.group(2))


def eval_sets(files: list[Path], prompts: tuple[int, int], limit: int | None = None) -> list:
    """The sets a comparison answers: prompts ``prompts[0]:prompts[1]`` of each bundled set, then every prompt of each
    file in ``files`` (JSONL in the bundled sets' layout, anywhere on disk: report data that nothing was chosen on);
    each cut to its first ``limit`` prompts when given.

    Returns:
        :class:`draftsmith.evaluation.sets.EvalSet` s, bundled first, each holding only the prompts to answer.

    Raises:
        draftsmith.errors.DataError: a file is missing, not JSONL, or a line has no ``turns`` list of strings.
        ValueError: a file's name (its stem) is a bundled set's or another file's, or a bundled set has no prompt in
            ``prompts``.
    """
    from dataclasses import replace

    from draftsmith.evaluation.sets import load_set

    lo, hi = prompts
    out = []
    for name in BUNDLED:
        es = load_set(name)
        if not es.prompts[lo:hi]:
            raise ValueError(f"eval set {name} has {len(es.prompts)} prompts, none in {lo + 1}-{hi}: pass a range "
                             "inside it (--prompts FIRST-LAST)")
        out.append(replace(es, prompts=es.prompts[lo:hi][:limit]))
    for path in files:
        if not Path(path).is_file():  # a name of a bundled set is not a file: refused here, not read as that set
            raise ValueError(f"{path} is not a file: give the path of a JSONL file with a 'turns' list per line")
        es = load_set(str(path), limit=limit)
        if es.name in {e.name for e in out}:
            raise ValueError(f"{path}: its name {es.name!r} is already a set of this comparison: rename the file "
                             f"(a set is named by its file's stem; the bundled ones are {', '.join(BUNDLED)})")
        out.append(es)
    return out


def data_sha256(data_dir: Path) -> str:
    """SHA-256 of a run's training data as the trainers read it: every sample's id, token ids and loss mask (sorted
    by id) and every draft vocabulary's tensors; independent of shard layout, file times and manifests' timestamps.

    Raises:
        draftsmith.errors.DataError: the data are missing or unreadable (:class:`TrainSamples`).
    """
    import hashlib

    import torch
    from draftsmith.drafter.data import TrainSamples
    from safetensors.torch import load_file

    h = hashlib.sha256()
    samples = TrainSamples(Path(data_dir)).samples
    for sid in sorted(samples):
        s = samples[sid]
        h.update(sid.encode() + b"\0")
        h.update(s.input_ids.to(torch.int64).numpy().tobytes())
        h.update(s.loss_mask.to(torch.int64).numpy().tobytes())
    for path in sorted((Path(data_dir) / "vocab").glob("draft-*.safetensors")):
        h.update(path.name.encode())
        for key, t in sorted(load_file(str(path)).items()):
            h.update(key.encode() + t.contiguous().view(-1).to(torch.int64).numpy().tobytes())
    return h.hexdigest()


def _counts(side: dict[int, list[PromptCounts]], keys: list[tuple[str, str]], name: str):
    """``side``'s accepted and drafts as two ``[seeds, prompts]`` arrays; ValueError on other prompts than ``keys``."""
    import numpy as np

    if not side:
        raise ValueError(f"{name} has no seed measured")
    for seed, rows in side.items():
        if [(p.set, p.id) for p in rows] != keys:
            raise ValueError(f"{name} seed {seed} was measured on different prompts than the other runs: measure "
                             "every seed of both sides on the same prompts, in the same order")
    acc = np.array([[p.accepted for p in rows] for rows in side.values()], dtype=float)
    drafts = np.array([[p.drafts for p in rows] for rows in side.values()], dtype=float)
    return acc, drafts


def seeded_ratio(ours: dict[int, list[PromptCounts]], base: dict[int, list[PromptCounts]], resamples: int = 4000,
                 rng_seed: int = 0) -> tuple[float, float, float]:
    """``acceptance_length(ours) / acceptance_length(base)`` with every seed pooled, and its 95 % percentile
    interval from a bootstrap over training seeds and prompts together.

    Each resample draws, with replacement, each side's training seeds (independently: the two sides' seeds are not
    paired) and one set of prompts shared by both sides (a prompt's difficulty is common to both drafters, so the
    prompts stay paired). The resampled statistic weighs each (seed, prompt) count by how often its seed and its
    prompt were drawn; the draws are multinomial counts from ``numpy.random.Generator.multinomial``. With one seed
    per side this is the paired bootstrap over prompts. A two-level (cluster) bootstrap as in Davison & Hinkley,
    *Bootstrap Methods and their Application* (1997), section 3.8.

    Args:
        ours, base: training seed -> that drafter's per-prompt counts; every list on the same prompts in one order.
        resamples: bootstrap resamples. rng_seed: the generator's seed (the same interval on every call).

    Returns:
        ``(ratio, low, high)``.

    Raises:
        ValueError: a side has no seed, or seeds were measured on different prompts.
    """
    import numpy as np

    first = next(iter(ours.values()), [])
    keys = [(p.set, p.id) for p in first]
    if not keys:
        raise ValueError("ours has no prompt measured")
    oa, od = _counts(ours, keys, "ours")  # [So, P]
    ba, bd = _counts(base, keys, "base")  # [Sb, P]
    point = (1 + oa.sum() / od.sum()) / (1 + ba.sum() / bd.sum())
    rng = np.random.default_rng(rng_seed)

    def draw(n: int):  # [R, n] how often each of n items is drawn in each resample
        return rng.multinomial(n, np.full(n, 1.0 / n), size=resamples)

    prompts = draw(len(keys))  # [R, P]
    ours_w, base_w = draw(oa.shape[0]), draw(ba.shape[0])  # [R, So], [R, Sb]

    def length(seed_w, acc, drafts):  # [R]
        return 1 + np.einsum("rs,sp,rp->r", seed_w, acc, prompts) / np.einsum("rs,sp,rp->r", seed_w, drafts, prompts)

    ratios = length(ours_w, oa, od) / length(base_w, ba, bd)
    low, high = np.quantile(ratios, [0.025, 0.975])
    return float(point), float(low), float(high)


def measure_in_vllm(speculative_config: dict, target: Path, sets, prompts: tuple[int, int], max_tokens: int,
                    eager: bool, log: Path, env: dict[str, str] | None = None,
                    concurrency: int = 1) -> list[PromptCounts]:
    """Serve ``target`` with one drafter in vLLM CPU and answer prompts ``prompts[0]:prompts[1]`` of every set
    (temperature 0, each prompt's turns in order), ``concurrency`` prompts at a time, each prompt's counts taken
    from vLLM's per-request speculative metrics (``--per-request-spec-decode-metrics summary``: the response's
    ``metrics.speculative_decoding``, verify steps and accepted draft tokens). Answered one at a time
    (``concurrency`` 1), the server-wide counters are read around each prompt too and must agree with them.

    Args:
        speculative_config: vLLM's ``--speculative-config``, e.g. ``{"method": "eagle3", "model": DIR,
            "num_speculative_tokens": 3}``; any drafter family vLLM serves.
        target: the target checkpoint folder. sets: :class:`draftsmith.evaluation.sets.EvalSet` s.
        prompts: 0-based half-open range of each set's prompts (:func:`prompt_range`).
        max_tokens: new tokens per answer (each turn). eager: vLLM without compilation (starts faster).
        log: the server's log file. env: the server's base environment (None: this process's), to which
            :func:`draftsmith.target.server.cpu_env`'s vLLM CPU settings are added where unset.
        concurrency: prompts in flight at once (the server's ``--max-num-seqs``). Batched, the target's greedy
            answers may differ from answers alone in a few tokens (batch-dependent float sums): compare drafters
            measured at the same concurrency only.

    Returns:
        One :class:`PromptCounts` per prompt, set by set, in the sets' order.

    Raises:
        ValueError: a set has no prompt in ``prompts``.
        draftsmith.errors.EngineError: the server did not start (the message carries its log tail), a request
            failed, or (one at a time) the per-request metrics disagree with the server's counters.
    """
    from draftsmith.config import load_settings
    from draftsmith.errors import EngineError
    from draftsmith.evaluation.runner import VLLMClient
    from draftsmith.target.server import VLLMServer, VLLMServerSpec, cpu_env, free_port

    lo, hi = prompts
    chosen = [(es, es.prompts[lo:hi]) for es in sets]
    for es, ps in chosen:
        if not ps:
            raise ValueError(f"eval set {es.name} has {len(es.prompts)} prompts, none in {lo + 1}-{hi}: "
                             "pass a range inside it (--prompts FIRST-LAST)")

    class _Spec(VLLMServerSpec):
        def env(self) -> dict[str, str]:  # vLLM's CPU settings over ``env`` instead of this process's environment
            full = super().env()
            if env is None:
                return full
            own = cpu_env(env, kv_cache_gib=self.kv_cache_gib)
            if "VLLM_ENABLE_V1_MULTIPROCESSING" in full:
                own["VLLM_ENABLE_V1_MULTIPROCESSING"] = full["VLLM_ENABLE_V1_MULTIPROCESSING"]
            return own

    s = load_settings()
    spec = _Spec(model=target, served_name=target.name, port=free_port(), dtype=s.target.dtype, max_model_len=2048,
                 kv_cache_gib=2, enforce_eager=eager, max_num_seqs=concurrency, speculative=dict(speculative_config),
                 extra_args=["--per-request-spec-decode-metrics", "summary"])
    work = [(es.name, p) for es, ps in chosen for p in ps]
    with VLLMServer(spec, log).start(timeout_s=1800) as server:
        client = VLLMClient(server.url, target.name, timeout_s=1800.0)  # one httpx client, shared by the threads

        def one(item) -> PromptCounts:
            name, p = item
            before = client.counters() if concurrency == 1 else None
            steps = accepted = 0
            messages: list[dict[str, str]] = []
            for user in p.turns:
                messages.append({"role": "user", "content": user})
                turn = client.generate(messages, max_tokens, 0.0)
                if turn.spec_metrics is None:
                    raise EngineError(f"the engine at {server.url} returned no metrics.speculative_decoding: was it "
                                      "started with --per-request-spec-decode-metrics and a drafter?")
                steps += turn.spec_metrics["num_spec_steps"]
                accepted += turn.spec_metrics["num_accepted_draft_tokens"]
                messages.append({"role": "assistant", "content": turn.text})
            if before is not None:
                d = client.counters() - before
                if (d.drafts, d.accepted) != (steps, accepted):
                    raise EngineError(f"prompt {name}/{p.id}: vLLM's counters say {d.drafts} verify steps and "
                                      f"{d.accepted} accepted, its per-request metrics {steps} and {accepted}")
            return PromptCounts(name, p.id, steps, accepted)

        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            return list(pool.map(one, work))


def concurrency_check(drafter: Path, prompts: str, levels: list[int], max_tokens: int, k: int, logs: Path) -> None:
    """One EAGLE-3 drafter measured at each concurrency of ``levels`` on the same prompts of the bundled sets: prints
    ``ACCEPT c=<C> <length>`` (pooled), ``ACCEPT c=<C> <set> <length>``, and per level after the first
    ``SAME_COUNTS c=<C> <prompts with identical counts>/<prompts>`` against the first level."""
    from draftsmith.config import load_settings
    from draftsmith.target.embedded import embedded_dir

    target = embedded_dir(load_settings().target.cache_dir)
    rng = prompt_range(prompts)
    sets = eval_sets([], rng)
    first = None
    for c in levels:
        t0 = time.perf_counter()
        got = measure_in_vllm({"method": "eagle3", "model": str(drafter), "num_speculative_tokens": k}, target, sets,
                              (0, rng[1] - rng[0]), max_tokens, False, logs / f"vllm-c{c}.log", concurrency=c)
        print(f"ACCEPT c={c} {acceptance_length(got):.3f} ({time.perf_counter() - t0:.0f} s, {len(got)} prompts)")
        for name in BUNDLED:
            print(f"ACCEPT c={c} {name} {acceptance_length([g for g in got if g.set == name]):.3f}")
        if first is None:
            first = got
        else:
            same = sum((a.drafts, a.accepted) == (b.drafts, b.accepted) for a, b in zip(first, got, strict=True))
            print(f"SAME_COUNTS c={c} {same}/{len(got)}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", type=Path, help="an EAGLE-3 drafter folder: measure it at each --concurrency")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--prompts", default="1-10", help="FIRST-LAST of each bundled set, or a split name")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--logs", type=Path, default=Path("."), help="where the servers' logs go")
    a = ap.parse_args()
    if a.drafter:
        concurrency_check(a.drafter, a.prompts, a.concurrency, a.max_tokens, a.k, a.logs)
    else:
        for name, text in SPLITS.items():
            print(f"{name}: prompts {text} of each set, 0-based {prompt_range(name)}")
