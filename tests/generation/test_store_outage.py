"""The object store going away mid-run: a real SeaweedFS stopped with SIGTERM while a real worker pool writes records
to it (the target is the stand-in HTTP server of the pool tests: the store is under test, not the model). Nothing
finished is lost, a command that needs the store says in one line what is wrong, and the run completes once the store
is back (the jobs that failed meanwhile are retried by rq)."""

from __future__ import annotations

import pytest
from draftsmith.config import load_settings
from draftsmith.errors import StorageError
from draftsmith.generation.enqueue import enqueue
from draftsmith.generation.store import iter_records, record_tally
from draftsmith.objectstore import SeaweedFS
from draftsmith.paths import RunPaths
from pool_helpers import REPO, Stub, pool_output, start_pool, stop_pool, wait_for
from s3fs import S3FileSystem

GSM8K = str(REPO / "data" / "prompts" / "gsm8k_train.jsonl")


@pytest.mark.slow
def test_the_store_going_away_loses_nothing_and_the_run_resumes(tmp_path, redis_url, monkeypatch):
    store = SeaweedFS(tmp_path / "weed").start()
    for k, v in store.env.items():
        monkeypatch.setenv(k, v)
    S3FileSystem.clear_instance_cache()  # s3fs keeps a client per process, made with the endpoint of its time
    store.make_bucket("outage")
    stub = Stub(delay_s=0.5)
    s = load_settings(None, {
        "runs_dir": "s3://outage/runs", "run": "o", "redis": {"url": redis_url, "prefix": "dstest"},
        "target": {"url": stub.url, "model": "stub"},
        "generation": {"max_tokens": 8, "batch_size": 4, "concurrency": 4, "backoff_s": 0.05, "job_retries": 6},
    })
    records = RunPaths(s.runs_dir, s.run).records
    n = 48
    enqueue(s, GSM8K, n, 4, say=lambda m: None)
    pool = start_pool(s, "--metrics-port", "0", **store.env)
    try:
        assert wait_for(lambda: len(record_tally(records).ids) >= 8, 120, every=0.5), pool_output(pool)[-3000:]
        store.stop()  # SIGTERM: the store goes away while jobs are writing
        with pytest.raises(StorageError) as err:
            enqueue(s, None, None, 4, say=lambda m: None)
        assert "s3://outage/runs/o" in str(err.value) and "cannot be reached" in str(err.value)
        assert "draftsmith-test-secret" not in str(err.value)
        store.start()  # back, same data folder and ports
        assert len(record_tally(records).ids) >= 8  # what was written before the outage is still there

        def finished() -> bool:
            if len(record_tally(records).ids) >= n:
                return True
            enqueue(s, None, None, 4, say=lambda m: None)  # a resume after the outage, as a user would
            return False

        assert wait_for(finished, 300, every=5.0), pool_output(pool)[-4000:]
        kept = [r["id"] for r in iter_records(records)]
    finally:
        out = stop_pool(pool)
        stub.close()
        store.stop()
    assert len(kept) == len(set(kept)) == n, out[-3000:]
    assert "StorageError" in out  # the jobs that met the outage failed with the store's one-line error, then ran again
