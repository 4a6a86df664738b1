"""Benchmark: the worker pool against a fast server, at run sizes 1,000 / 10,000 / 50,000 prompts.

A fast local OpenAI-compatible server (``bench/stub_target.py``: vLLM-shaped bodies with ``token_ids``, no delay)
stands in for the target, so the pool, not the model, is what is measured. For each size, on the same prompts and
at the same concurrency (``generation.concurrency``, default 128):

- bare: asyncio :class:`~draftsmith.generation.client.ChatClient` s with a semaphore, in as many forked processes
  as the pool has workers (the prompts split between them, the concurrency too), so both sides may use every core;
- pool: ``draftsmith worker`` with its defaults (processes = ceil(concurrency / batch_size) + 1), started and idle
  before timing; workers are suspended (rq) during ``enqueue`` and timed from their resumption to the last record.

``--busy``: a process of the benchmark's own spins on one core for the whole measurement (started before the
first run, stopped after the last), as on a shared host; its CPU is not counted.

Printed per size: req/s of both, their ratio, the pool's CPU per job (CPU seconds of every pool process, from
``RUSAGE_CHILDREN``, minus the pool's idle start-up CPU, per job: constant when a job's cost does not grow with the
run), and that CPU beyond the bare client's CPU for the same requests (``per-job overhead``; the bare client's own
CPU per request falls with the run's length as its connections warm up, so this one is noisy at 1,000). Last lines:
``CPU_PER_REQUEST pool <ms> bare <ms>`` and ``RATIO generation_scale <pool/bare at 10,000>`` (or at the largest
size run, named, without 10,000: `make bench` runs 1,000).

``--tail``: a long-tailed server instead (``--tail-fraction`` of the prompts, 2 % by default, answered
``--tail-factor`` = 20 times slower than the others' ``--tail-delay-s``), pool vs bare with the same process counts;
the pool hands a request off to the run's tail after ``--handoff-after-s`` (``generation.handoff_after_s``; 0 =
off). Prints ``RATIO generation_tail <pool/bare>`` (goal >= 0.8).

``--scale-out``: two pools (as two compose generator containers) against one Redis and two server replicas with a
fixed delay and a fixed number of sequences each (the servers are the bottleneck), vs one pool against one replica;
prints ``RATIO generation_scale_out <two/one>`` (goal >= 1.8).

Usage: ``python bench/generation_scale.py [--sizes 1000,10000,50000] [--busy] [--scale-out] [--tail]``; Redis from
``BENCH_DRAFTSMITH_REDIS_URL`` (default ``redis://127.0.0.1:6379/15``; the database is flushed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
from draftsmith.config import GenerationConfig, load_settings
from draftsmith.generation.client import ChatClient
from draftsmith.generation.enqueue import enqueue
from draftsmith.generation.store import done_ids
from rq.suspension import resume, suspend

REPO = Path(__file__).resolve().parents[1]
PREFIX = "dsbench"


def start_stub(*args: str) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen([sys.executable, str(REPO / "bench" / "stub_target.py"), *args], stdout=subprocess.PIPE,
                         text=True)
    return p, f"http://127.0.0.1:{int(p.stdout.readline().split()[1])}"


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def prompts_file(work: Path, n: int) -> Path:
    src = work / f"prompts-{n}.jsonl"
    src.write_text("".join(json.dumps({"question": f"Question {i}: what is {i} + {i}?"}) + "\n" for i in range(n)))
    return src


def start_spinner() -> subprocess.Popen:
    """A process that keeps one core busy until killed (the other tenants of a shared host)."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def stop(p: subprocess.Popen | None) -> None:
    if p is not None:
        p.kill()
        p.wait()


async def bare_client(url: str, msgs: list, concurrency: int) -> None:
    """Every request of ``msgs`` through one ChatClient, ``concurrency`` at a time."""
    client = ChatClient(url, "stub", max_connections=concurrency, stream=GenerationConfig().stream)  # as the pool
    sem = asyncio.Semaphore(concurrency)

    async def one(m):
        async with sem:
            await client.chat(m, {"max_tokens": 8, "temperature": 0.0, "return_token_ids": True})

    await asyncio.gather(*(one(m) for m in msgs))
    await client.aclose()


def _bare_process(url: str, msgs: list, concurrency: int, go) -> None:
    go.wait()
    asyncio.run(bare_client(url, msgs, concurrency))


def bare(url: str, src: Path, concurrency: int, procs: int) -> tuple[int, float, float]:
    """(requests, seconds, CPU seconds) of ``procs`` forked bare clients answering every prompt of ``src`` (each a
    share of the prompts and ``ceil(concurrency / procs)`` of the concurrency); timed from a common start."""
    msgs = [[{"role": "user", "content": json.loads(line)["question"]}] for line in src.read_text().splitlines()]
    ctx = multiprocessing.get_context("fork")
    go = ctx.Event()
    per = math.ceil(concurrency / procs)
    ps = [ctx.Process(target=_bare_process, args=(url, msgs[i::procs], per, go)) for i in range(procs)]
    for p in ps:
        p.start()
    time.sleep(0.5)  # forked and waiting
    c0, t0 = children_cpu(), time.perf_counter()
    go.set()
    for p in ps:
        p.join()
    dt, cpu = time.perf_counter() - t0, children_cpu() - c0
    if any(p.exitcode for p in ps):
        raise RuntimeError(f"a bare client failed: exit codes {[p.exitcode for p in ps]}")
    return len(msgs), dt, cpu


def pool_env(redis_url: str, work: Path, url: str, concurrency: int) -> dict[str, str]:
    """The environment of a benchmark pool (its Redis, runs folder, target and concurrency)."""
    return dict(os.environ, DRAFTSMITH_REDIS__URL=redis_url, DRAFTSMITH_REDIS__PREFIX=PREFIX,
                DRAFTSMITH_RUNS_DIR=str(work), DRAFTSMITH_TARGET__URL=url, DRAFTSMITH_LOG_LEVEL="WARNING",
                DRAFTSMITH_GENERATION__CONCURRENCY=str(concurrency), DRAFTSMITH_GENERATION__MAX_TOKENS="8")


def start_pool(env: dict[str, str], *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "draftsmith", "worker", "--metrics-port", "0", *extra], env=env,
                            start_new_session=True)


def stop_pool(p: subprocess.Popen) -> None:
    os.killpg(p.pid, signal.SIGINT)
    try:
        p.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def wait_idle(r: redis.Redis, n_workers: int, timeout: float = 120) -> None:
    from rq import Worker

    t0 = time.time()
    while Worker.count(connection=r) < n_workers and time.time() - t0 < timeout:
        time.sleep(0.2)
    time.sleep(1.0)


def pool_run(redis_url: str, work: Path, url: str, src: Path, n: int, concurrency: int, run: str,
             urls: list[str] | None = None, **gen) -> tuple[float, int, int]:
    """(seconds, jobs, worker processes) of one or more pools answering ``src``; each pool talks to one url.
    ``gen``: more ``generation`` settings of the run (the jobs carry them)."""
    r = redis.Redis.from_url(redis_url)
    s = load_settings(None, {"runs_dir": str(work), "run": run, "redis": {"url": redis_url, "prefix": PREFIX},
                             "target": {"url": url, "model": "stub"},
                             "generation": {"concurrency": concurrency, "max_tokens": 8, "min_free_disk_gb": 0,
                                            **gen}})
    from draftsmith.jobqueue.pool import default_processes

    procs = default_processes(s, ["generate"])
    pools = [start_pool(pool_env(redis_url, work, u, concurrency)) for u in (urls or [url])]
    try:  # the pools run in sessions of their own: stopped here whatever ends the run (SIGTERM included)
        wait_idle(r, procs * len(pools))
        suspend(r)
        rep = enqueue(s, str(src), None, s.generation.batch_size, say=lambda m: None)
        records = work / run / "records"
        t0 = time.perf_counter()
        resume(r)
        while len(done_ids(records)) < n:
            time.sleep(0.25)
        dt = time.perf_counter() - t0
    finally:
        for p in pools:
            stop_pool(p)
    return dt, len(rep.jobs), procs * len(pools)


def idle_pool_cpu(redis_url: str, work: Path, url: str, concurrency: int) -> float:
    """CPU seconds of a pool that starts, idles and stops (its fixed cost, subtracted from the runs)."""
    r = redis.Redis.from_url(redis_url)
    s = load_settings(None, {"generation": {"concurrency": concurrency}})
    from draftsmith.jobqueue.pool import default_processes

    c0 = children_cpu()
    p = start_pool(pool_env(redis_url, work, url, concurrency))
    try:
        wait_idle(r, default_processes(s, ["generate"]))
    finally:
        stop_pool(p)
    return children_cpu() - c0


def pool_processes(concurrency: int) -> int:
    """Worker processes of a default pool at ``concurrency`` (the bare clients get as many)."""
    from draftsmith.jobqueue.pool import default_processes

    return default_processes(load_settings(None, {"generation": {"concurrency": concurrency}}), ["generate"])


def sizes_run(redis_url: str, sizes: list[int], concurrency: int, busy: bool) -> None:
    stub, url = start_stub()
    spinner = start_spinner() if busy else None
    ratio_10k = None
    procs_b = pool_processes(concurrency)
    try:
        with tempfile.TemporaryDirectory(prefix="ds-scale-") as tmp:
            work = Path(tmp)
            idle = idle_pool_cpu(redis_url, work, url, concurrency)
            print(f"pool start-up CPU (idle pool, subtracted): {idle:.2f} s")
            print("| prompts | bare req/s | pool req/s | pool/bare | pool processes | jobs | pool CPU per job (ms) "
                  "| per-job overhead (CPU ms) |")
            print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
            for n in sizes:
                redis.Redis.from_url(redis_url).flushdb()
                src = prompts_file(work, n)
                nb, tb, cpu_b = bare(url, src, concurrency, procs_b)
                c0 = children_cpu()
                tp, jobs, procs = pool_run(redis_url, work, url, src, n, concurrency, f"scale{n}")
                cpu_p = children_cpu() - c0 - idle
                overhead_ms = 1000 * (cpu_p - cpu_b) / max(1, jobs)
                ratio = (n / tp) / (nb / tb)
                if n == 10000 or ratio_10k is None or 10000 not in sizes:
                    ratio_10k, at, cpu_req = ratio, n, (1000 * cpu_p / n, 1000 * cpu_b / n)
                print(f"| {n} | {nb / tb:.0f} | {n / tp:.0f} | {ratio:.3f} | {procs} | {jobs} | "
                      f"{1000 * cpu_p / max(1, jobs):.0f} | {overhead_ms:.1f} |", flush=True)
    finally:
        stop(spinner)
        stop(stub)
    if ratio_10k is not None:  # at 10,000 prompts; at the largest size run when 10,000 is not among them
        print(f"bare clients: {procs_b} processes; busy host (one core spun by the benchmark): {busy}")
        print(f"CPU_PER_REQUEST pool {cpu_req[0]:.2f} bare {cpu_req[1]:.2f}")
        print(f"RATIO generation_scale {ratio_10k:.3f}" + ("" if at == 10000 else f" (at {at} prompts)"))


def scale_out_run(redis_url: str, n: int, concurrency: int, delay_s: float, slots: int) -> None:
    """One pool + one replica vs two pools + two replicas; each replica serves ``slots`` requests at once."""
    a, url_a = start_stub("--delay-s", str(delay_s), "--max-concurrency", str(slots))
    b, url_b = start_stub("--delay-s", str(delay_s), "--max-concurrency", str(slots))
    try:
        with tempfile.TemporaryDirectory(prefix="ds-scaleout-") as tmp:
            work = Path(tmp)
            src = prompts_file(work, n)
            redis.Redis.from_url(redis_url).flushdb()
            t1, _, _ = pool_run(redis_url, work, url_a, src, n, concurrency, "one")
            redis.Redis.from_url(redis_url).flushdb()
            t2, _, _ = pool_run(redis_url, work, url_a, src, n, concurrency, "two", urls=[url_a, url_b])
    finally:
        for p in (a, b):
            p.kill()
            p.wait()
    print(f"scale-out: {n} prompts, replicas of {slots} sequences x {delay_s} s; one pool {n / t1:.0f} req/s, "
          f"two pools {n / t2:.0f} req/s")
    print(f"RATIO generation_scale_out {t1 / t2:.3f}")


def tail_run(redis_url: str, n: int, concurrency: int, delay_s: float, fraction: float, factor: float,
             handoff_s: float, busy: bool) -> None:
    """Pool vs bare clients (same process counts) against a long-tailed server."""
    stub, url = start_stub("--delay-s", str(delay_s), "--tail-fraction", str(fraction), "--tail-factor", str(factor))
    spinner = start_spinner() if busy else None
    procs_b = pool_processes(concurrency)
    try:
        with tempfile.TemporaryDirectory(prefix="ds-tail-") as tmp:
            work = Path(tmp)
            src = prompts_file(work, n)
            redis.Redis.from_url(redis_url).flushdb()
            nb, tb, _ = bare(url, src, concurrency, procs_b)
            tp, jobs, procs = pool_run(redis_url, work, url, src, n, concurrency, "tail", handoff_after_s=handoff_s)
            tails = len(redis.Redis.from_url(redis_url).keys("rq:job:gen-*")) - jobs  # tail jobs left their hash
    finally:
        stop(spinner)
        stop(stub)
    print(f"long tail: {n} prompts, {fraction:.0%} answered in {factor * delay_s:.1f} s, the rest in {delay_s} s; "
          f"concurrency {concurrency}; hand-off after {handoff_s} s; busy host: {busy}")
    print(f"bare ({procs_b} processes) {nb / tb:.0f} req/s ({tb:.1f} s); pool ({procs} processes, {jobs} batch jobs, "
          f"{tails} tail jobs) {n / tp:.0f} req/s ({tp:.1f} s)")
    print(f"RATIO generation_tail {tb / tp:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,50000", help="Comma-separated run sizes (prompts).")
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument("--scale-out", action="store_true", help="Measure two pools + two replicas instead.")
    ap.add_argument("--scale-out-prompts", type=int, default=2000)
    ap.add_argument("--busy", action="store_true", help="Keep one core busy with a spinning process meanwhile.")
    ap.add_argument("--tail", action="store_true", help="Measure the long-tailed server profile instead.")
    ap.add_argument("--tail-prompts", type=int, default=4000)
    ap.add_argument("--tail-delay-s", type=float, default=0.5, help="Latency of the ordinary answers.")
    ap.add_argument("--tail-fraction", type=float, default=0.02)
    ap.add_argument("--tail-factor", type=float, default=20.0)
    ap.add_argument("--handoff-after-s", type=float, default=1.5, help="generation.handoff_after_s (0 = off).")
    a = ap.parse_args()
    from draftsmith.signals import raise_on_sigterm

    raise_on_sigterm()  # SIGTERM unwinds through the finally blocks that stop the pools and servers
    redis_url = os.environ.get("BENCH_DRAFTSMITH_REDIS_URL", "redis://127.0.0.1:6379/15")
    if a.scale_out:
        scale_out_run(redis_url, a.scale_out_prompts, a.concurrency, delay_s=0.2, slots=16)
    elif a.tail:
        tail_run(redis_url, a.tail_prompts, a.concurrency, a.tail_delay_s, a.tail_fraction, a.tail_factor,
                 a.handoff_after_s, a.busy)
    else:
        sizes_run(redis_url, [int(x) for x in a.sizes.split(",") if x], a.concurrency, a.busy)


if __name__ == "__main__":
    main()
