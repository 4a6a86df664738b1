"""`draftsmith status` says failed / stalled with the reason and the fix instead of "[running] ... ETA": real Redis,
real rq workers and registries, the real CLI, a real small file system for the full disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from draftsmith.generation.progress import ProgressBoard
from draftsmith.jobqueue.queues import get_queue

PREFIX = "dshealth"
JOB_FUNC = "draftsmith.generation.jobs.generate_job"


def _run(tmp_path: Path, n: int = 8) -> Path:
    root = tmp_path / "runs" / "t"
    (root / "records").mkdir(parents=True)
    rows = [{"id": f"p{i}", "messages": [{"role": "user", "content": f"q{i}"}]} for i in range(n)]
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def _status(tmp_path: Path, redis_url: str, **env) -> str:
    e = {**os.environ, "DRAFTSMITH_REDIS__URL": redis_url, "DRAFTSMITH_REDIS__PREFIX": PREFIX,
         "DRAFTSMITH_RUNS_DIR": str(tmp_path / "runs"), "DRAFTSMITH_GENERATION__MIN_FREE_DISK_GB": "0", **env}
    p = subprocess.run([sys.executable, "-m", "draftsmith", "status", "--run", "t"], env=e, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return next(line for line in p.stdout.splitlines() if line.startswith("generation"))


def _enqueue(client, root: Path, ids: list[str], bad: bool = True):
    """A generation job of this run; ``bad`` jobs lack arguments, so they fail for good in a real worker."""
    kwargs = {"run_root": str(root.resolve()), "prompt_ids": ids}
    if not bad:
        kwargs.update(job_id="x", model="m", settings={})
    return get_queue(client, PREFIX, "generate").enqueue(JOB_FUNC, kwargs=kwargs, failure_ttl=3600)


def test_jobs_failed_for_good_show_failed_with_the_reason(tmp_path, redis_url):
    client = redis.Redis.from_url(redis_url)
    root = _run(tmp_path)
    board = ProgressBoard(client, PREFIX, root)
    board.set(phase="enqueued", total=8, done_at_start=0)
    board.start_if_unset()
    for ids in (["p0", "p1", "p2", "p3"], ["p4", "p5", "p6", "p7"]):
        _enqueue(client, root, ids)
    code = ("import redis; from rq import Worker; from rq.serializers import JSONSerializer; "
            f"from draftsmith.jobqueue.queues import get_queue; c = redis.Redis.from_url({redis_url!r}); "
            f"Worker([get_queue(c, {PREFIX!r}, 'generate')], connection=c, serializer=JSONSerializer).work(burst=True)")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=120)  # a real rq worker
    line = _status(tmp_path, redis_url)
    assert line.startswith("generation: [failed] 0/8 done"), line
    assert "8 prompts failed for good in 2 jobs: TypeError" in line and "(2 jobs)" in line
    assert "ETA -" in line and "-> fix the cause, then `draftsmith enqueue --run t` re-enqueues" in line


def test_no_record_for_long_with_work_queued_is_stalled(tmp_path, redis_url):
    client = redis.Redis.from_url(redis_url)
    root = _run(tmp_path)
    board = ProgressBoard(client, PREFIX, root)
    now = time.time()
    board.set(phase="running", total=8, done_at_start=0, started_at=repr(now - 1000), last_result_at=repr(now - 900),
              requests_ok=1, latency_sum_s=2.0, completion_tokens=10)
    _enqueue(client, root, ["p0", "p1"], bad=False)  # queued, and no worker takes it
    line = _status(tmp_path, redis_url)
    assert line.startswith("generation: [stalled] 0/8 done"), line
    assert "no new record for 9" in line and "missing 8: 2 queued, 6 in no job" in line and "ETA -" in line
    assert "check that workers run" in line and "`draftsmith enqueue --run t` re-enqueues" in line
    board.set(last_result_at=repr(time.time()))  # a fresh result: running again, with its ETA
    assert _status(tmp_path, redis_url).startswith("generation: [running] 0/8 done")


def test_nothing_queued_and_prompts_missing_says_enqueue_again(tmp_path, redis_url):
    client = redis.Redis.from_url(redis_url)
    root = _run(tmp_path)
    ProgressBoard(client, PREFIX, root).set(phase="running", total=8, done_at_start=0, started_at=repr(time.time()))
    line = _status(tmp_path, redis_url)
    assert line.startswith("generation: [stalled] 0/8 done"), line
    assert "missing 8: 8 in no job; no job is queued or running -> `draftsmith enqueue --run t`" in line


def test_full_disk_is_stalled_not_running(tmp_path, redis_url):
    """The run folder on a 1 MiB tmpfs (a private mount namespace, `unshare -rm`), below min_free_disk_gb."""
    client = redis.Redis.from_url(redis_url)
    src = _run(tmp_path / "src")
    runs = tmp_path / "runs"
    runs.mkdir()
    root = runs / "t"
    ProgressBoard(client, PREFIX, root).set(phase="running", total=8, done_at_start=0, started_at=repr(time.time()))
    _enqueue(client, root, ["p0"], bad=False)
    env = {**os.environ, "DRAFTSMITH_REDIS__URL": redis_url, "DRAFTSMITH_REDIS__PREFIX": PREFIX,
           "DRAFTSMITH_RUNS_DIR": str(runs)}
    script = (f"mount -t tmpfs -o size=1m none {runs} || exit 97; cp -r {src} {root}; "
              f"{sys.executable} -m draftsmith status --run t")
    p = subprocess.run(["unshare", "-rm", "sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    line = next(x for x in p.stdout.splitlines() if x.startswith("generation"))
    assert line.startswith("generation: [stalled] 0/8 done") and "disk full: 0.00 GB free" in line, line
    assert "free some space" in line


def test_every_stage_snapshot_has_one_shape_and_status_prints_its_line(tmp_path):
    from draftsmith.artifacts.status import read_snapshots, snapshot_line, snapshot_phase, write_snapshot

    snap = write_snapshot(tmp_path, "train", "running", "step 3/10 loss 2.1", step=3)
    assert set(snap) == {"stage", "phase", "line", "updated_at", "step"} and isinstance(snap["updated_at"], float)
    (tmp_path / "status" / "old.json").write_text('{"stage": "old", "updated_at": "2026-11-30T10:00:00Z"}')
    (tmp_path / "status" / "torn.json").write_text('{"stage": ')
    snaps = {s["stage"]: s for s in read_snapshots(tmp_path)}
    assert set(snaps) == {"train", "old"}  # an unreadable file is left out, not fatal
    assert snapshot_line(snaps["train"]) == "step 3/10 loss 2.1" and snapshot_phase(snaps["train"]) == "running"
    assert snaps["old"]["updated_at"] == 0.0 and snapshot_line(snaps["old"]) == "(no progress line yet)"
    with pytest.raises(ValueError, match="unknown stage phase"):
        write_snapshot(tmp_path, "train", "finished", "x")


def test_the_progress_line_counts_the_leases_held_now(tmp_path, redis_url):
    """The demo's progress hint printed "in flight 0" for a whole run: only `status` passed the lease count. The
    snapshot now reads it itself, so every caller shows the same figure."""
    from draftsmith.generation.progress import snapshot
    from draftsmith.jobqueue.inflight import InflightCap

    client = redis.Redis.from_url(redis_url)
    root = _run(tmp_path)
    board = ProgressBoard(client, PREFIX, root)
    board.set(phase="running", total=8, done_at_start=0)
    board.start_if_unset()
    cap = InflightCap(client, PREFIX, 8)
    tokens = [cap.try_acquire() for _ in range(3)]
    assert all(tokens)
    snap = snapshot(client, PREFIX, root)
    assert snap.in_flight == 3 and "in flight 3," in snap.line()
    assert "in flight 3," in _status(tmp_path, redis_url)
    cap.exchange(tokens, 0)
    assert snapshot(client, PREFIX, root).in_flight == 0
