"""Fault drills of the generation worker pool, on real processes: `draftsmith worker` pools (rq forks
workers, work-horses and a scheduler), the real Redis, and ``bench/stub_target.py`` as the target (a real HTTP
server in its own process; it is the pool that is drilled, not a model).

Drills: ``starts`` burst pools of 4 processes (a hang is a pool still running after 120 s), ``kills`` work-horses
SIGKILLed mid-request (leases left after the run), a SIGKILLed worker holding the scheduler lock (its scheduler
must go), a target restart mid-run, a Redis FLUSHDB mid-run (then ``enqueue`` again), and a full disk (a small
tmpfs in a private mount namespace; then space is freed and the run resumes). After each drill every prompt must
have exactly one record. Prints one line per drill and a last line ``DRILLS lost=<n> duplicated=<n> leaked=<n>
hung=<n>`` (all 0 when the pool is right).

Usage: ``python bench/drills.py [--starts 40] [--kills 5]``; Redis from ``BENCH_DRAFTSMITH_REDIS_URL`` (default
``redis://127.0.0.1:6379/15``; that database is flushed).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import redis

REPO = Path(__file__).resolve().parents[1]
PREFIX = "dsdrill"
TOTALS = collections.Counter()


def stub(*args: str) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen([sys.executable, str(REPO / "bench" / "stub_target.py"), *args], stdout=subprocess.PIPE,
                         text=True)
    return p, f"http://127.0.0.1:{int(p.stdout.readline().split()[1])}"


def env(redis_url: str, runs: Path, url: str) -> dict[str, str]:
    return dict(os.environ, DRAFTSMITH_REDIS__URL=redis_url, DRAFTSMITH_REDIS__PREFIX=PREFIX,
                DRAFTSMITH_RUNS_DIR=str(runs), DRAFTSMITH_TARGET__URL=url, DRAFTSMITH_TARGET__MODEL="stub",
                DRAFTSMITH_RUN="d", DRAFTSMITH_LOG_LEVEL="WARNING", DRAFTSMITH_GENERATION__MIN_FREE_DISK_GB="0",
                DRAFTSMITH_GENERATION__BACKOFF_S="0.2", DRAFTSMITH_GENERATION__MAX_TOKENS="8")


def ds(e: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "draftsmith", *args], env=e, capture_output=True, text=True,
                          timeout=timeout)


def pool(e: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "draftsmith", "worker", "--metrics-port", "0", *args], env=e,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGINT)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


def prompts(path: Path, n: int, tag: str) -> Path:
    path.write_text("".join(json.dumps({"question": f"{tag} question {i}?"}) + "\n" for i in range(n)))
    return path


def count(runs: Path, n: int, r: redis.Redis, name: str, hung: int = 0, extra: str = "") -> None:
    """Record the drill's lost / duplicated / leaked counts (one line)."""
    c = collections.Counter()
    for f in sorted((runs / "d" / "records").glob("*.meta.json")):
        c.update(json.loads(f.read_text())["ids"])
    lost, dup = n - len(c), sum(v - 1 for v in c.values())
    leaked = inflight_count(r)
    TOTALS.update(lost=lost, duplicated=dup, leaked=leaked, hung=hung)
    print(f"{name}: prompts={n} lost={lost} duplicated={dup} leaked={leaked} hung={hung} {extra}".rstrip(), flush=True)


def inflight_count(r: redis.Redis) -> int:
    """Live in-flight leases of the generate stage, every target's."""
    from draftsmith.jobqueue.inflight import InflightCap

    return InflightCap(r, PREFIX, 1).in_flight_all_targets()


def fresh(tmp: Path, name: str, r: redis.Redis) -> Path:
    r.flushdb()
    runs = tmp / name
    runs.mkdir()
    return runs


def drill_starts(tmp: Path, r: redis.Redis, redis_url: str, url: str, starts: int) -> None:
    runs = fresh(tmp, "starts", r)
    e = env(redis_url, runs, url)
    hung, n = 0, 0
    for i in range(starts):
        src = prompts(tmp / f"starts-{i}.jsonl", 8, f"start{i}")
        ds(e, "enqueue", "--source", str(src), "--batch-size", "2")
        n += 8
        p = pool(e, "--burst", "--processes", "4")
        try:
            p.wait(120)
        except subprocess.TimeoutExpired:
            hung += 1
        stop(p)
    count(runs, n, r, f"{starts} burst pool starts", hung=hung)


def drill_kills(tmp: Path, r: redis.Redis, redis_url: str, kills: int) -> None:
    slow, url = stub("--delay-s", "3")
    runs = fresh(tmp, "kills", r)
    e = env(redis_url, runs, url)
    ds(e, "enqueue", "--source", str(prompts(tmp / "kills.jsonl", 16 * (kills + 1), "kill")), "--batch-size", "16")
    p = pool(e, "--processes", "1", "--concurrency", "16")
    done = 0
    try:
        while done < kills:
            kids = [c for w in psutil.Process(p.pid).children() for c in w.children() if os.getpgid(c.pid) == c.pid]
            if kids and inflight_count(r) >= 8:
                kids[0].send_signal(signal.SIGKILL)
                done += 1
                time.sleep(1)
            time.sleep(0.2)
        time.sleep(3)
        ds(e, "enqueue")  # the killed jobs' prompts (rq marks an abandoned job failed after its retries)
        t0 = time.time()
        while len(list((runs / "d" / "records").glob("*.meta.json"))) and time.time() - t0 < 300:
            c = sum(len(json.loads(f.read_text())["ids"]) for f in (runs / "d" / "records").glob("*.meta.json"))
            if c >= 16 * (kills + 1):
                break
            time.sleep(1)
    finally:
        stop(p)
        slow.kill()
        slow.wait()
    count(runs, 16 * (kills + 1), r, f"{kills} work-horse kills")


def drill_scheduler(tmp: Path, r: redis.Redis, redis_url: str, url: str) -> None:
    runs = fresh(tmp, "sched", r)
    e = env(redis_url, runs, url)
    p = pool(e, "--processes", "1")
    leaked = 0
    try:
        t0 = time.time()
        while not r.get(f"rq:scheduler-lock:{PREFIX}:generate") and time.time() - t0 < 60:
            time.sleep(0.2)
        (worker,) = psutil.Process(p.pid).children()
        sched = worker.children()
        worker.send_signal(signal.SIGKILL)
        time.sleep(5)
        leaked = sum(1 for s in sched if s.is_running() and s.status() != psutil.STATUS_ZOMBIE)
        ds(e, "enqueue", "--source", str(prompts(tmp / "sched.jsonl", 8, "sched")), "--batch-size", "2")
        t0 = time.time()
        while time.time() - t0 < 120 and len(list((runs / "d" / "records").glob("*.meta.json"))) < 4:
            time.sleep(0.5)
    finally:
        stop(p)
    TOTALS.update(leaked=leaked)
    count(runs, 8, r, "killed scheduler holder", extra=f"orphaned_schedulers={leaked}")


def drill_target_restart(tmp: Path, r: redis.Redis, redis_url: str) -> None:
    srv, url = stub("--delay-s", "0.5")
    port = url.rsplit(":", 1)[1]
    runs = fresh(tmp, "restart", r)
    e = env(redis_url, runs, url)
    ds(e, "enqueue", "--source", str(prompts(tmp / "restart.jsonl", 64, "restart")), "--batch-size", "8")
    p = pool(e, "--processes", "2", "--concurrency", "16")
    try:
        time.sleep(3)
        srv.kill()
        srv.wait()
        time.sleep(2)
        srv, _ = stub("--port", port, "--delay-s", "0.5")
        t0 = time.time()
        while time.time() - t0 < 180:
            c = sum(len(json.loads(f.read_text())["ids"]) for f in (runs / "d" / "records").glob("*.meta.json"))
            if c >= 64:
                break
            time.sleep(0.5)
    finally:
        stop(p)
        srv.kill()
        srv.wait()
    count(runs, 64, r, "target restart")


def drill_flush(tmp: Path, r: redis.Redis, redis_url: str) -> None:
    srv, url = stub("--delay-s", "0.5")
    runs = fresh(tmp, "flush", r)
    e = env(redis_url, runs, url)
    ds(e, "enqueue", "--source", str(prompts(tmp / "flush.jsonl", 64, "flush")), "--batch-size", "8")
    p = pool(e, "--processes", "2", "--concurrency", "16")
    try:
        time.sleep(3)
        r.flushdb()
        ds(e, "enqueue")
        t0 = time.time()
        while time.time() - t0 < 180:
            c = sum(len(json.loads(f.read_text())["ids"]) for f in (runs / "d" / "records").glob("*.meta.json"))
            if c >= 64:
                break
            time.sleep(0.5)
        time.sleep(2)
    finally:
        stop(p)
        srv.kill()
        srv.wait()
    count(runs, 64, r, "redis FLUSHDB")


def drill_full_disk(tmp: Path, r: redis.Redis, redis_url: str) -> None:
    srv, url = stub("--answer-bytes", "100000")
    runs = fresh(tmp, "disk", r)
    e = env(redis_url, runs, url)
    src = prompts(tmp / "disk.jsonl", 40, "disk")
    d = f"{sys.executable} -m draftsmith"
    script = f"""
mount -t tmpfs -o size=8m none {runs} || exit 97
{d} enqueue --source {src} --batch-size 4 >/dev/null 2>&1 || exit 98
head -c 500000 /dev/zero > {runs}/spare; head -c 16000000 /dev/zero > {runs}/filler 2>/dev/null; rm {runs}/spare
{d} worker --burst --processes 1 --metrics-port 0 > {tmp}/disk-first.log 2>&1; echo "first $?"
ls -a {runs}/d/records | grep -c '\\.tmp-' ; rm {runs}/filler
{d} enqueue >/dev/null 2>&1; {d} worker --burst --processes 1 --metrics-port 0 >/dev/null 2>&1; echo "second $?"
cat {runs}/d/records/*.meta.json > {tmp}/disk-metas.txt
"""
    try:
        p = subprocess.run(["unshare", "-rm", "sh", "-c", script], env=e, capture_output=True, text=True, timeout=600)
    finally:
        srv.kill()
        srv.wait()
    out = p.stdout.split()
    metas = (tmp / "disk-metas.txt").read_text().replace("}{", "}\n{").splitlines()
    c = collections.Counter(i for m in metas if m.strip() for i in json.loads(m)["ids"])
    lost, dup = 40 - len(c), sum(v - 1 for v in c.values())
    tmp_left = int(out[2]) if len(out) > 2 and out[2].isdigit() else -1
    TOTALS.update(lost=lost, duplicated=dup, leaked=max(0, tmp_left))
    print(f"full disk: prompts=40 lost={lost} duplicated={dup} temp_files_left={tmp_left} "
          f"pool_exit={out[1] if len(out) > 1 else '?'} (2 = stopped with one line) resumed_exit={out[-1]}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=40)
    ap.add_argument("--kills", type=int, default=5)
    a = ap.parse_args()
    redis_url = os.environ.get("BENCH_DRAFTSMITH_REDIS_URL", "redis://127.0.0.1:6379/15")
    r = redis.Redis.from_url(redis_url)
    fast, url = stub()
    try:
        with tempfile.TemporaryDirectory(prefix="ds-drills-") as t:
            tmp = Path(t)
            drill_starts(tmp, r, redis_url, url, a.starts)
            drill_kills(tmp, r, redis_url, a.kills)
            drill_scheduler(tmp, r, redis_url, url)
            drill_target_restart(tmp, r, redis_url)
            drill_flush(tmp, r, redis_url)
            drill_full_disk(tmp, r, redis_url)
    finally:
        fast.kill()
        fast.wait()
        r.flushdb()
    print(f"DRILLS lost={TOTALS['lost']} duplicated={TOTALS['duplicated']} leaked={TOTALS['leaked']} "
          f"hung={TOTALS['hung']}")


if __name__ == "__main__":
    main()
