"""Extraction of a run on a real S3 store (SeaweedFS): `draftsmith extract` enqueues jobs that carry the run's URL,
a real `draftsmith worker --queues extract` on another "host" (its own empty working copy) runs them with the real
SmolLM2 target (hf backend, CPU), and the feature shards in the store equal those of the same data extracted on a
local disk. `extract --sync` does the same in one process; a stale manifest in the store is rebuilt from its sidecars
by whoever pulls the features.

Before, `extract` without `--sync` refused a run on a store: queue jobs read a local run folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from draftsmith.artifacts.location import run_location
from draftsmith.features.queue import enqueue_shards
from draftsmith.staging import pull, push
from rq import Queue, SimpleWorker
from rq.serializers import JSONSerializer
from safetensors.torch import load, load_file


def cli(s3_runs: str, stage_dir, target, *args: str, redis_url: str = "", timeout: int = 600) -> str:
    """One `draftsmith` command as a host that shares only the store (and Redis) with the test."""
    env = {**os.environ, "DRAFTSMITH_RUNS_DIR": s3_runs, "DRAFTSMITH_STAGE_DIR": str(stage_dir),
           "DRAFTSMITH_TARGET__PATH": str(target), "DRAFTSMITH_EXTRACT__BATCH_TOKENS": "256",
           "DRAFTSMITH_REDIS__PREFIX": "dsobj"}
    if redis_url:
        env["DRAFTSMITH_REDIS__URL"] = redis_url
    p = subprocess.run([sys.executable, "-m", "draftsmith", *args], env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return p.stdout + p.stderr


def local_features(data_run, make_settings, redis_url) -> dict[int, dict[str, torch.Tensor]]:
    """The same data extracted on a local disk (a real rq worker in this process)."""
    import redis

    s = make_settings(data_run)
    s = s.model_copy(update={"redis": s.redis.model_copy(update={"url": redis_url, "prefix": "dslocal"})})
    from unittest import mock

    enqueue_shards(s, str(data_run), [0, 1])
    conn = redis.Redis.from_url(redis_url)
    # the worker's own batch budget, the same as the store hosts' (cli): a job carries only the run's settings
    with mock.patch.dict(os.environ, {"DRAFTSMITH_EXTRACT__BATCH_TOKENS": "256"}):
        SimpleWorker([Queue("dslocal:extract", connection=conn, serializer=JSONSerializer)], connection=conn,
                     serializer=JSONSerializer).work(burst=True)
    return {i: load_file(str(data_run / "features" / f"features-{i:05d}.safetensors")) for i in (0, 1)}


def stored_features(root) -> dict[int, dict[str, torch.Tensor]]:
    return {i: load((root / "features" / f"features-{i:05d}.safetensors").read_bytes()) for i in (0, 1)}


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for i in a:
        assert a[i].keys() == b[i].keys() and all(torch.equal(a[i][k], b[i][k]) for k in a[i]), i


@pytest.mark.slow
def test_queue_jobs_extract_a_store_run_on_another_host(data_run, make_settings, embedded_target, s3_runs, redis_url,
                                                        tmp_path):
    root = run_location(s3_runs) / "t"
    assert push(data_run, root, ("data",)) == 3  # two data shards and the manifest, as build-data left them
    out = cli(s3_runs, tmp_path / "host-a", embedded_target, "extract", "--run", "t", redis_url=redis_url)
    assert "enqueued 2 extraction jobs" in out, out[-2000:]
    # host B: a resident extraction worker with nothing but Redis, the run's URL and an empty working copy
    out = cli(s3_runs, tmp_path / "host-b", embedded_target, "worker", "--queues", "extract", "--burst",
              "--processes", "1", "--metrics-port", "0", redis_url=redis_url)
    assert out.count("loading target") == 1, out[-3000:]
    names = sorted(p.name for p in (root / "features").iterdir())
    assert names == ["features-00000.json", "features-00000.safetensors", "features-00001.json",
                     "features-00001.safetensors", "manifest.json"], names
    # the working copy of host B keeps no feature shard the store holds
    assert not list((tmp_path / "host-b").rglob("features-*.safetensors"))
    # a later `extract` finds nothing left and rebuilds the store's manifest from its sidecars
    out = cli(s3_runs, tmp_path / "host-a", embedded_target, "extract", "--run", "t", redis_url=redis_url)
    assert "nothing to do" in out, out[-2000:]
    m = json.loads((root / "features" / "manifest.json").read_text())
    assert [s["file"] for s in m["shards"]] == ["features-00000.safetensors", "features-00001.safetensors"]
    assert m["samples"] == 5
    assert_same(stored_features(root), local_features(data_run, make_settings, redis_url))


@pytest.mark.slow
def test_extract_sync_on_a_store_run_and_a_stale_manifest_rebuilt_on_pull(data_run, make_settings, embedded_target,
                                                                          s3_runs, redis_url, tmp_path):
    root = run_location(s3_runs) / "t"
    push(data_run, root, ("data",))
    out = cli(s3_runs, tmp_path / "host-a", embedded_target, "extract", "--run", "t", "--sync")
    assert "extracted 2/2 shards, 5 samples" in out, out[-2000:]  # the message of a local run: one walk
    assert_same(stored_features(root), local_features(data_run, make_settings, redis_url))
    # a manifest written while another host was finishing shard 1 lists only shard 0; a training host's pull
    # rebuilds it from the sidecars
    m = json.loads((root / "features" / "manifest.json").read_text())
    (root / "features" / "manifest.json").write_text(json.dumps({**m, "shards": m["shards"][:1], "samples": 3}))
    local = tmp_path / "host-c" / "t"
    pull(root, local, ("features",))
    rebuilt = json.loads((local / "features" / "manifest.json").read_text())
    assert [s["data_shard"] for s in rebuilt["shards"]] == [0, 1] and rebuilt["samples"] == 5
    assert {k: v for k, v in rebuilt.items() if k not in ("shards", "samples", "tokens", "skipped_samples",
                                                          "code_version")} == \
        {k: v for k, v in m.items() if k not in ("shards", "samples", "tokens", "skipped_samples", "code_version")}
