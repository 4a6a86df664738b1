"""Helpers of the pool fault tests: the local stand-in target (bench/stub_target.py, a real HTTP server in its own
process; it is the pool under test, not a model), real `draftsmith worker` processes and process-tree lookups."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
from draftsmith.config import load_settings

REPO = Path(__file__).resolve().parents[2]
STUB = REPO / "bench" / "stub_target.py"


class Stub:
    """bench/stub_target.py in a subprocess."""

    def __init__(self, delay_s: float = 0.0, answer_bytes: int = 0, *extra: str) -> None:
        self.proc = subprocess.Popen([sys.executable, str(STUB), "--delay-s", str(delay_s), "--answer-bytes",
                                      str(answer_bytes), *extra], stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line.startswith("READY"), line
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def stats(self) -> dict:
        return httpx.get(self.url + "/stats", timeout=5).json()

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def settings_for(tmp_path: Path, redis_url: str, url: str, **gen):
    return load_settings(None, {
        "runs_dir": str(tmp_path / "runs"), "run": "t", "redis": {"url": redis_url, "prefix": "dstest"},
        "target": {"url": url, "model": "stub"},
        "generation": {"max_tokens": 8, "batch_size": 4, "backoff_s": 0.05, "min_free_disk_gb": 0, **gen},
    })


def host_env(s) -> dict[str, str]:
    """``DRAFTSMITH_*`` variables of the generation host keys of ``s`` that differ from the defaults: a worker
    takes its host settings (timeouts, retries, concurrency, hand-off) from its environment, never from a job."""
    from draftsmith.config import Settings, key_kinds

    default = Settings.model_validate({}).generation
    return {f"DRAFTSMITH_GENERATION__{k.split('.')[1].upper()}": str(getattr(s.generation, k.split(".")[1]))
            for k, kind in key_kinds().items() if kind == "host" and k.startswith("generation.")
            and getattr(s.generation, k.split(".")[1]) != getattr(default, k.split(".")[1])}


def env_for(s, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"DRAFTSMITH_REDIS__URL": s.redis.url, "DRAFTSMITH_REDIS__PREFIX": s.redis.prefix,
                "DRAFTSMITH_RUNS_DIR": str(s.runs_dir), "DRAFTSMITH_TARGET__URL": s.target.url,
                "DRAFTSMITH_GENERATION__MIN_FREE_DISK_GB": "0", **host_env(s), **extra})
    return env


def start_pool(s, *args: str, **env: str) -> subprocess.Popen:
    """A `draftsmith worker` process in its own session (so a test can stop its whole tree). Its output goes to a
    file, not a pipe: a pipe nobody reads while the test waits on the pool fills up and blocks the pool's logging;
    :func:`pool_output` reads it."""
    if "--processes" not in args:
        args = ("--processes", "1", *args)
    log = tempfile.TemporaryFile(mode="w+", prefix="draftsmith-pool-")
    p = subprocess.Popen([sys.executable, "-m", "draftsmith", "worker", *args], env=env_for(s, **env),
                         stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    p.output_file = log
    return p


def pool_output(p: subprocess.Popen) -> str:
    """Everything a pool started by :func:`start_pool` has printed so far."""
    p.output_file.seek(0)
    return p.output_file.read()


def wait_pool(p: subprocess.Popen, timeout: float) -> str:
    """Wait up to ``timeout`` s for a (burst) pool to exit; returns its output. A pool still running then fails the
    test with its output (stopped first)."""
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        out = stop_pool(p)
        raise AssertionError(f"the pool was still running after {timeout:.0f} s; its output:\n{out[-4000:]}") from None
    return pool_output(p)


def stop_pool(p: subprocess.Popen) -> str:
    """SIGINT the pool's session, then SIGKILL whatever is left of it; returns its output."""
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
    p.wait(10)
    return pool_output(p)


def wait_for(cond, timeout: float = 60, every: float = 0.1):
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = cond()
        if v:
            return v
        time.sleep(every)
    return None


def workers_of(pool_pid: int) -> list[psutil.Process]:
    """The rq worker processes of a pool (its direct children)."""
    return psutil.Process(pool_pid).children()


def horses_of(worker: psutil.Process) -> list[psutil.Process]:
    """Work-horses of an rq worker: the children that lead their own process group (rq's ``os.setpgrp``)."""
    out = []
    for c in worker.children():
        try:
            if os.getpgid(c.pid) == c.pid:
                out.append(c)
        except ProcessLookupError:
            pass
    return out


def write_prompts_source(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
