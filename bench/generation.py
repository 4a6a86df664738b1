"""Benchmark: output tokens/s of the draftsmith worker pool vs a bare asyncio client, same server, same requests.

Both send the same GSM8K prompts with the same request body (the pool's sampling parameters and
``return_token_ids``, greedy, so both generate the same tokens) at the same concurrency to one vLLM CPU server,
in this process's lifetime, interleaved: bare, pool, bare, pool, bare. The baseline is the mean of the three bare
runs, the pool figure the mean of the two pool runs, which cancels drift. Each pool run is a fresh
``draftsmith worker`` with its own defaults (processes, job size) and ``--concurrency`` set to the bare client's;
it is started and idle before timing and is timed from ``enqueue`` to the newest record shard's write time (the
shard's mtime, so polling costs no CPU the server needs). On these 2-core machines vLLM binds its compute threads to
both cores, so every CPU-second a client spends is taken from the server: the CPU seconds each client used are
printed beside its throughput. Last line: ``RATIO generation <pool tok/s / bare tok/s>`` (goal >= 0.98).

Usage: ``python bench/generation.py`` (starts vLLM; ~8 min) or with ``BENCH_DRAFTSMITH_VLLM_URL=http://...``.
"""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import redis
from draftsmith.config import load_settings
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
    client = ChatClient(url, MODEL)
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


def pool_run(url: str, redis_url: str, work: Path) -> tuple[int, float, float]:
    """One fresh ``draftsmith worker`` with its defaults; (completion tokens, wall s, pool CPU s from ``enqueue``
    to its stop, start-up excluded)."""
    s = settings(work, url, redis_url)
    env = dict(os.environ, DRAFTSMITH_REDIS__URL=redis_url, DRAFTSMITH_REDIS__PREFIX="dsbench",
               DRAFTSMITH_RUNS_DIR=str(work), DRAFTSMITH_TARGET__URL=url, DRAFTSMITH_LOG_LEVEL="WARNING",
               DRAFTSMITH_GENERATION__MAX_TOKENS=str(MAX_TOKENS))
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


def main() -> None:
    """Start vLLM (unless given a URL), run bare/pool/bare/pool/bare and print the RATIO line."""
    url = os.environ.get("BENCH_DRAFTSMITH_VLLM_URL")
    server = None
    if not url:
        from draftsmith.target.embedded import prepare_embedded
        from draftsmith.target.server import VLLMServer, VLLMServerSpec, free_port

        path = prepare_embedded(Path.home() / ".cache" / "draftsmith")
        server = VLLMServer(VLLMServerSpec(model=path, served_name=MODEL, port=free_port()),
                            Path(tempfile.mkdtemp()) / "vllm.log").start()
        url = server.url
    redis_url = os.environ.get("BENCH_DRAFTSMITH_REDIS", "redis://127.0.0.1:6379/14")
    r = redis.Redis.from_url(redis_url)
    r.flushdb()
    prompts = extract_prompts(str(REPO / "data/prompts/gsm8k_train.jsonl"), N).prompts
    with tempfile.TemporaryDirectory() as tmp:
        s = settings(Path(tmp), url, redis_url)
        body = {**sampling_params(s), **({"return_token_ids": True} if s.generation.return_token_ids else {})}
    bares, pools = [], []
    try:
        asyncio.run(bare(url, prompts[:8], body))  # warm-up
        for leg in range(5):
            if leg % 2 == 0:
                bares.append(asyncio.run(bare(url, prompts, body)))
            else:
                with tempfile.TemporaryDirectory() as work:
                    pools.append(pool_run(url, redis_url, Path(work)))
                r.flushdb()
    finally:
        r.flushdb()
        if server:
            server.stop()
    print(f"prompts {N}, concurrency {CONCURRENCY}, max_tokens {MAX_TOKENS}, server {url}")
    for name, runs in (("bare asyncio client", bares), ("worker pool (defaults)", pools)):
        for t, d, c in runs:
            print(f"{name}: {t} tok in {d:.2f} s ({t / d:.1f} tok/s), client CPU {c:.2f} s")
    base = sum(t / d for t, d, _ in bares) / len(bares)
    pool = sum(t / d for t, d, _ in pools) / len(pools)
    print(f"bare mean {base:.1f} tok/s, pool mean {pool:.1f} tok/s")
    print(f"RATIO generation {pool / base:.3f}")


if __name__ == "__main__":
    main()
