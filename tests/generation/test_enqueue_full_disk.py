"""`draftsmith enqueue` on a full disk: one line, exit 2, the run's prompts.jsonl unchanged, no temporary file and
no job enqueued for prompts that were not written. Real Redis, the real vLLM CPU server, a real full file system: a
1 MiB tmpfs mounted over the runs folder in a private mount namespace (``unshare -rm``: no root needed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

pytestmark = pytest.mark.e2e

GSM8K = Path(__file__).resolve().parents[2] / "data" / "prompts" / "gsm8k_train.jsonl"


def test_enqueue_on_a_full_disk_is_one_line_and_loses_nothing(tmp_path, redis_url, vllm_server):
    runs = tmp_path / "runs"
    runs.mkdir()
    ds = f"{sys.executable} -m draftsmith enqueue --source {GSM8K} --batch-size 5"
    script = f"""
mount -t tmpfs -o size=1m none {runs} || exit 97
{ds} --limit 5 > {tmp_path}/first.log 2>&1; echo "first rc $?"
head -c 2000000 /dev/zero > {runs}/filler 2>/dev/null
{ds} --limit 400 > {tmp_path}/full.out 2> {tmp_path}/full.err; echo "full rc $?"
ls -a {runs}/t > {tmp_path}/ls.txt
wc -l < {runs}/t/prompts.jsonl
"""
    env = {**os.environ, "DRAFTSMITH_REDIS__URL": redis_url, "DRAFTSMITH_REDIS__PREFIX": "dsdisk",
           "DRAFTSMITH_RUNS_DIR": str(runs), "DRAFTSMITH_RUN": "t", "DRAFTSMITH_TARGET__URL": vllm_server,
           "DRAFTSMITH_GENERATION__MIN_FREE_DISK_GB": "0"}
    p = subprocess.run(["unshare", "-rm", "sh", "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert "first rc 0" in p.stdout, p.stdout + p.stderr + (tmp_path / "first.log").read_text()[-2000:]
    err = (tmp_path / "full.err").read_text()
    assert "full rc 2" in p.stdout, p.stdout + err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: the disk is full") and "free some space" in last, last
    assert p.stdout.strip().splitlines()[-1].strip() == "5"  # prompts.jsonl still holds the 5 written prompts
    assert not [n for n in (tmp_path / "ls.txt").read_text().split() if ".tmp-" in n]
    from rq import Queue

    q = Queue("dsdisk:generate", connection=redis.Redis.from_url(redis_url))
    assert q.count == 1  # the first enqueue's one job; none for the 395 prompts that were never written
