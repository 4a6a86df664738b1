"""A job says what, the service that runs it says how: real `draftsmith worker --queues extract` processes on a real
Redis, the real SmolLM2 target. An extraction job enqueued with one host's settings runs with the worker's own
backend, device, parallelism and batch budget; a job whose run settings disagree with the run's record fails with
both values and the fix, and the shards the run finished stay as they were."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import build_data
from draftsmith.features.queue import enqueue_shards
from rq.job import Job
from rq.serializers import JSONSerializer


def _enqueuer(make_settings, run_dir: Path, redis_url: str, **extract):
    """The generator container's settings: what `make extract` enqueues with."""
    s = make_settings(run_dir, **extract)
    return s.model_copy(update={"redis": s.redis.model_copy(update={"url": redis_url, "prefix": "dsjob"})})


def _worker(s, timeout: float, **env: str) -> str:
    """One burst of a real extraction worker pool with its own environment; returns its output."""
    full = {**os.environ, "DRAFTSMITH_REDIS__URL": s.redis.url, "DRAFTSMITH_REDIS__PREFIX": s.redis.prefix,
            "DRAFTSMITH_TARGET__PATH": str(s.target.path), **env}
    p = subprocess.run([sys.executable, "-m", "draftsmith", "worker", "--queues", "extract", "--processes", "1",
                        "--metrics-port", "0", "--burst"], env=full, capture_output=True, text=True,
                       timeout=timeout, start_new_session=True)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    return p.stdout + p.stderr


def _job(s, jid: str) -> Job:
    import redis

    return Job.fetch(jid, connection=redis.Redis.from_url(s.redis.url), serializer=JSONSerializer)


def test_the_workers_host_settings_win_over_the_enqueuers(tmp_path, embedded_target, make_settings, redis_url):
    run_dir = tmp_path / "runs" / "t"
    build_data(run_dir, embedded_target, shard_sizes=(1,))
    # the enqueuer says vllm, one rank, bf16, 256-token batches; the worker says hf (cheap here), three ranks,
    # expert parallel, float32, 512-token batches: the worker's own apply
    s = _enqueuer(make_settings, run_dir, redis_url, backend="vllm", compute_dtype="bfloat16",
                  tensor_parallel_size=1, enable_expert_parallel=False)
    (jid,) = enqueue_shards(s, str(run_dir), [0])
    carried = _job(s, jid).args[2]
    assert carried["run"] == "t" and carried["extract"] == {"layers": None, "dtype": "bfloat16"}
    assert "backend" not in json.dumps(carried) and "redis" not in carried
    out = _worker(s, 300, DRAFTSMITH_EXTRACT__BACKEND="hf", DRAFTSMITH_EXTRACT__TENSOR_PARALLEL_SIZE="3",
                  DRAFTSMITH_EXTRACT__ENABLE_EXPERT_PARALLEL="true", DRAFTSMITH_EXTRACT__COMPUTE_DTYPE="float32",
                  DRAFTSMITH_EXTRACT__BATCH_TOKENS="512")
    result = _job(s, jid).return_value()
    assert result["status"] == "done" and result["samples"] == 1
    assert result["host"] == {"backend": "hf", "device": "cpu", "compute_dtype": "float32",
                              "tensor_parallel_size": 3, "enable_expert_parallel": True, "batch_tokens": 512,
                              "write_tokens": None}
    assert "backend hf, device cpu, tensor parallel 3, expert parallel True, batch_tokens 512" in out
    assert "loading target" in out and "(backend hf, cpu, float32;" in out
    assert json.loads((run_dir / "features" / "manifest.json").read_text())["backend"] == "hf"


def test_a_job_whose_run_settings_disagree_is_refused_and_finished_shards_stay(tmp_path, embedded_target,
                                                                             make_settings, redis_url):
    run_dir = tmp_path / "runs" / "t"
    build_data(run_dir, embedded_target, shard_sizes=(1, 1))
    a = _enqueuer(make_settings, run_dir, redis_url, layers=[1, 14, 26])
    enqueue_shards(a, str(run_dir), [0])
    _worker(a, 300)
    done = {f.name: f.read_bytes() for f in (run_dir / "features").iterdir()}
    assert "features-00000.safetensors" in done
    (jid,) = enqueue_shards(a, str(run_dir), [1])
    # another checkout enqueues the run with other layers: the run records them; shard 1's job is still queued
    b = _enqueuer(make_settings, run_dir, redis_url, layers=[2, 15, 27])
    assert enqueue_shards(b, str(run_dir), [1]) == []
    out = _worker(a, 120)
    job = _job(a, jid)
    assert job.is_failed
    err = job.latest_result().exc_string
    assert "extraction job of shard 1 carries run settings that disagree with what the run recorded" in err
    assert "extract.layers: job [1, 14, 26], run [2, 15, 27]" in err and "draftsmith extract" in err
    assert "loading target" not in out  # refused before the target is touched
    assert {f.name: f.read_bytes() for f in (run_dir / "features").iterdir()} == done  # shard 0 stays as it was
    # `draftsmith status` shows the refused job, its reason with both values, and what to do
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTSMITH_")}
    env.update(DRAFTSMITH_RUNS_DIR=str(run_dir.parent), DRAFTSMITH_REDIS__URL=a.redis.url,
               DRAFTSMITH_REDIS__PREFIX=a.redis.prefix)
    st = subprocess.run([sys.executable, "-m", "draftsmith", "status", "--run", "t"], env=env, capture_output=True,
                        text=True, timeout=120)
    assert st.returncode == 0, st.stderr[-2000:]
    (line,) = [x for x in st.stdout.splitlines() if x.startswith("extraction queue:")]
    assert line.startswith("extraction queue: 1 job(s) failed for good, shard(s) 1: ")
    assert "RunSettingsMismatch" in line and "extract.layers: job [1, 14, 26], run [2, 15, 27]" in line
    assert "`draftsmith extract --run t` enqueues their shards again" in line


@pytest.mark.slow
def test_a_job_enqueued_with_hf_runs_on_the_extractors_own_vllm_backend(tmp_path, embedded_target, make_settings,
                                                                        redis_url):
    """The GPU host's case on the CPU build: the generator enqueues with backend hf; the extractor's environment says
    vllm, and the job runs on vLLM (its engine started by the worker)."""
    run_dir = tmp_path / "runs" / "t"
    build_data(run_dir, embedded_target, shard_sizes=(1,))
    s = _enqueuer(make_settings, run_dir, redis_url, backend="hf")
    (jid,) = enqueue_shards(s, str(run_dir), [0])
    env = {"DRAFTSMITH_EXTRACT__BACKEND": "vllm", "DRAFTSMITH_EXTRACT__COMPUTE_DTYPE": "float32"}
    out = _worker(s, 900, **env)
    result = _job(s, jid).return_value()
    assert result["status"] == "done" and result["host"]["backend"] == "vllm", out[-3000:]
    assert "(backend vllm," in out
    assert json.loads((run_dir / "features" / "manifest.json").read_text())["backend"] == "vllm"
