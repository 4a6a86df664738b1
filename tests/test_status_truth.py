"""Every count `draftsmith status` prints comes from the records and from where rq really holds the rest: real Redis,
real rq workers failing real jobs, records written by the record store, the real CLI.

Before, a failed job's prompts all counted as "failed for good", those already answered by another job included
("4 prompts in 1 jobs failed for good" when 1 lacked a record), next to a message promising a retry.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import redis
from draftsmith.generation.progress import ProgressBoard
from draftsmith.generation.store import iter_records, write_shard
from draftsmith.jobqueue.queues import get_queue
from rq import Retry

PREFIX = "dstruth"
JOB_FUNC = "draftsmith.generation.jobs.generate_job"


def _status(tmp_path: Path, redis_url: str) -> str:
    env = {**os.environ, "DRAFTSMITH_REDIS__URL": redis_url, "DRAFTSMITH_REDIS__PREFIX": PREFIX,
           "DRAFTSMITH_RUNS_DIR": str(tmp_path / "runs"), "DRAFTSMITH_GENERATION__MIN_FREE_DISK_GB": "0"}
    p = subprocess.run([sys.executable, "-m", "draftsmith", "status", "--run", "t"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return next(line for line in p.stdout.splitlines() if line.startswith("generation"))


def _burst_worker(redis_url: str) -> None:
    code = ("import redis; from rq import Worker; from rq.serializers import JSONSerializer; "
            f"from draftsmith.jobqueue.queues import get_queue; c = redis.Redis.from_url({redis_url!r}); "
            f"Worker([get_queue(c, {PREFIX!r}, 'generate')], connection=c, serializer=JSONSerializer).work(burst=True)")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=120)


def test_each_printed_count_matches_the_records_and_the_jobs(tmp_path, redis_url):
    client = redis.Redis.from_url(redis_url)
    root = tmp_path / "runs" / "t"
    records = root / "records"
    records.mkdir(parents=True)
    ids = [f"p{i}" for i in range(12)]
    (root / "prompts.jsonl").write_text("".join(
        json.dumps({"id": i, "messages": [{"role": "user", "content": i}]}) + "\n" for i in ids))
    # answered: three ok and one permanent error (the server refused it: a record that counts as done)
    write_shard(records, "gen-a", [{"id": i, "status": "ok"} for i in ids[:3]]
                + [{"id": "p3", "status": "error", "error": {"reason": "context_length"}}])
    board = ProgressBoard(client, PREFIX, root)
    board.set(phase="running", total=12, done_at_start=0, **{"err:server_error": 3, "err:context_length": 1})
    board.start_if_unset()
    queue = get_queue(client, PREFIX, "generate")

    def job(prompt_ids, **kw):  # its arguments are incomplete, so a real worker fails it
        return queue.enqueue(JOB_FUNC, kwargs={"run_root": str(root.resolve()), "prompt_ids": prompt_ids},
                             failure_ttl=3600, **kw)

    job(["p0", "p4"])  # fails for good; p0 was answered by another job
    job(["p5", "p6"], retry=Retry(max=1, interval=3600))  # fails once, scheduled to run again in an hour
    _burst_worker(redis_url)
    orphan = job(["p8", "p9"])
    job(["p7"])
    assert client.lmove(queue.key, queue.intermediate_queue_key).decode() == orphan.id  # its worker died there
    client.set(queue.intermediate_queue.get_first_seen_key(orphan.id), time.time() - 60)
    # p10 and p11 are in no job (a Redis flush, say)

    line = _status(tmp_path, redis_url)
    on_disk = list(iter_records(records))
    done, errors = len({r["id"] for r in on_disk}), sum(r["status"] == "error" for r in on_disk)
    assert (done, errors) == (4, 1)
    assert f"] {done}/12 done ({errors} error records; failed requests: context_length=1, server_error=3)" in line
    m = re.search(r"missing (\d+): (.*?)( \(last error|$| ->)", line)
    assert m, line
    printed = {label: int(n) for n, label in re.findall(r"(\d+) ([a-z ]+?)(?:,|$)", m.group(2))}
    assert int(m.group(1)) == 12 - done == sum(printed.values())
    assert printed == {"queued": 1, "to be retried": 2, "held by a worker that is gone": 2, "failed for good": 1,
                       "in no job": 2}, line
    assert "-> `draftsmith enqueue --run t` requeues what no live job holds" in line
    assert "will be retried" not in line
