"""Benchmark: output tokens/s of the draftsmith worker pool vs a bare asyncio client, same server, same prompts.

Both runs send the same 32 GSM8K prompts (greedy, so both generate the same tokens) at the same concurrency to
one vLLM CPU server, in this process's lifetime: bare client, worker pool, bare client again (the baseline is
the mean of the two, which cancels drift). The pool is started before timing (steady state) and timed from
``enqueue`` to the last record shard. Last line: ``RATIO generation <pool tok/s / bare tok/s>`` (goal >= 0.95).

Usage: ``python bench/generation.py`` (starts vLLM; ~4 min) or with ``DRAFTSMITH_BENCH_VLLM_URL=http://...``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
from draftsmith.config import load_settings
from draftsmith.generation.client import ChatClient
from draftsmith.generation.enqueue import enqueue
from draftsmith.generation.sources import extract_prompts
from draftsmith.generation.store import done_ids, iter_records

REPO = Path(__file__).resolve().parents[1]
N, CONCURRENCY, MAX_TOKENS = 32, 32, 64
MODEL = "SmolLM2-135M-Instruct"


async def bare(url: str, prompts) -> tuple[int, float]:
    client = ChatClient(url, MODEL)
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(p):
        async with sem:
            r = await client.chat(p.messages, {"max_tokens": MAX_TOKENS, "temperature": 0.0, "seed": 0})
            return r.usage["completion_tokens"]

    t0 = time.perf_counter()
    toks = await asyncio.gather(*(one(p) for p in prompts))
    dt = time.perf_counter() - t0
    await client.aclose()
    return sum(toks), dt


def pool_run(url: str, redis_url: str, work: Path) -> tuple[int, float]:
    s = load_settings(None, {"runs_dir": str(work), "run": "bench", "redis": {"url": redis_url, "prefix": "dsbench"},
                             "target": {"url": url},
                             "generation": {"max_tokens": MAX_TOKENS, "concurrency": CONCURRENCY,
                                            "batch_size": CONCURRENCY // 4}})
    env = dict(os.environ, DRAFTSMITH_REDIS__URL=redis_url, DRAFTSMITH_REDIS__PREFIX="dsbench",
               DRAFTSMITH_RUNS_DIR=str(work), DRAFTSMITH_TARGET__URL=url, DRAFTSMITH_LOG_LEVEL="WARNING")
    w = subprocess.Popen([sys.executable, "-m", "draftsmith", "worker", "--processes", "4", "--metrics-port", "0",
                          "--concurrency", str(CONCURRENCY)], env=env, start_new_session=True)
    time.sleep(8)  # workers up and idle
    records = work / "bench" / "records"
    t0 = time.perf_counter()
    enqueue(s, str(REPO / "data/prompts/gsm8k_train.jsonl"), N, CONCURRENCY // 4, say=lambda m: None)
    while len(done_ids(records)) < N:
        time.sleep(0.05)
    dt = time.perf_counter() - t0
    os.killpg(w.pid, signal.SIGINT)
    w.wait(60)
    toks = sum(r["turns"][0]["usage"]["completion_tokens"] for r in iter_records(records))
    return toks, dt


def main() -> None:
    url = os.environ.get("DRAFTSMITH_BENCH_VLLM_URL")
    server = None
    if not url:
        from draftsmith.target.embedded import prepare_embedded
        from draftsmith.target.server import VLLMServer, VLLMServerSpec, free_port

        path = prepare_embedded(Path.home() / ".cache" / "draftsmith")
        server = VLLMServer(VLLMServerSpec(model=path, served_name=MODEL, port=free_port()),
                            Path(tempfile.mkdtemp()) / "vllm.log").start()
        url = server.url
    redis_url = os.environ.get("DRAFTSMITH_BENCH_REDIS", "redis://127.0.0.1:6379/14")
    redis.Redis.from_url(redis_url).flushdb()
    prompts = extract_prompts(str(REPO / "data/prompts/gsm8k_train.jsonl"), N).prompts
    try:
        asyncio.run(bare(url, prompts[:4]))  # warm-up
        t1, d1 = asyncio.run(bare(url, prompts))
        with tempfile.TemporaryDirectory() as work:
            tp, dp = pool_run(url, redis_url, Path(work))
        t2, d2 = asyncio.run(bare(url, prompts))
    finally:
        redis.Redis.from_url(redis_url).flushdb()
        if server:
            server.stop()
    base = (t1 / d1 + t2 / d2) / 2
    pool = tp / dp
    print(f"prompts {N}, concurrency {CONCURRENCY}, max_tokens {MAX_TOKENS}, server {url}")
    print(f"bare asyncio client: {t1} tok in {d1:.2f} s ({t1 / d1:.1f} tok/s), again {t2} tok in {d2:.2f} s "
          f"({t2 / d2:.1f} tok/s)")
    print(f"worker pool (4 processes): {tp} tok in {dp:.2f} s ({pool:.1f} tok/s)")
    print(f"RATIO generation {pool / base:.3f}")


if __name__ == "__main__":
    main()
