"""Every stage on two machines sharing nothing but Redis and an object store.

Each "host" is a real process tree in its own mount and pid namespace (``unshare -m -p -f --mount-proc``) with a
private, empty tmpfs over ``/tmp`` (its working copies live there): no shared disk, and pids that collide across
hosts as in containers. One real Redis, one real SeaweedFS (S3), the real SmolLM2 target on vLLM CPU.

The chained test: two hosts regenerate 240 prompts; host A's whole tree is killed with SIGKILL mid-run (its
namespace's pid 1 dies, so every process in it does, as when a machine is lost) and host B finishes, every prompt
once. Then, each on hosts of its own: build-data; extraction jobs taken by workers on two hosts; training on two
nodes (torchrun, c10d rendezvous, one rank per host), bit-identical to two ranks on one host's local disk; export;
evaluation in vLLM. Every artifact is read from and written to the store.

Against a local ``runs_dir`` a worker on a host without the run folder stopped every job with FileNotFoundError;
now it refuses the job at once, puts it back, and says how to fix it.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest
import redis
import torch
from draftsmith.artifacts import records as records_artifact
from draftsmith.config import load_settings
from draftsmith.generation.enqueue import enqueue
from draftsmith.generation.store import iter_records, record_tally
from draftsmith.jobqueue.inflight import InflightCap
from draftsmith.paths import RunPaths
from pool_helpers import Stub, host_env, pool_output, settings_for, stop_pool, wait_for, wait_pool

REPO = Path(__file__).resolve().parents[2]
GSM8K = str(REPO / "data" / "prompts" / "gsm8k_train.jsonl")
MODEL = "SmolLM2-135M-Instruct"
# a few steps of the drafter's training (every host and node the same)
TRAIN = dict(batch_size=4, batch_tokens=1024, eval_fraction=0.1, log_every=2, eval_every=1000, save_every=2,
             max_steps=4, lr=1e-3, warmup_ratio=0.1, draft_vocab_size=512)


def private_tmp() -> str:
    """Shell commands, run inside a host's new mount namespace, that put a fresh 1 GiB tmpfs over ``/tmp`` and keep
    the code visible: a checkout (or its virtualenv) that itself lives under ``/tmp`` is bind-mounted back at its
    own path, through a private tmpfs on ``/mnt`` that holds it while ``/tmp`` is replaced."""
    keep = sorted({str(p) for p in (REPO, Path(sys.prefix)) if Path(p).is_relative_to("/tmp")})
    keep = [p for p in keep if not any(p != q and Path(p).is_relative_to(q) for q in keep)]  # outermost only
    stash = [f"mount --bind {shlex.quote(p)} /mnt/keep{i}" for i, p in enumerate(keep)]
    back = [f"mkdir -p {shlex.quote(p)} && mount --move /mnt/keep{i} {shlex.quote(p)}" for i, p in enumerate(keep)]
    made = [f"mkdir /mnt/keep{i}" for i in range(len(keep))]
    steps = ([*(["mount -t tmpfs tmpfs /mnt"] + made if keep else []), *stash, "mount -t tmpfs -o size=1g tmpfs /tmp",
              *back])
    return " && ".join(steps)


def start_host(s, *args: str, env: dict[str, str], spend_pids: bool = False) -> subprocess.Popen:
    """A `draftsmith` command (args) as pid 1's child in a new mount + pid namespace, /tmp a fresh tmpfs of its own
    (its working copies go there: ``stage_dir`` /tmp/stage; a checkout under /tmp stays visible,
    :func:`private_tmp`); its output goes to a file of the test (opened before the namespace hides /tmp).

    Args:
        spend_pids: start the command as the namespace's fourth process, not its first: torch's rendezvous names a
            node by host name and pid, and these "hosts" share the host name.
    """
    start = "(true); (true); " if spend_pids else "exec "
    inner = (f"{private_tmp()} && cd / && {start}{sys.executable} -m draftsmith " + shlex.join(args))
    full = dict(os.environ)
    full.update({"DRAFTSMITH_REDIS__URL": s.redis.url, "DRAFTSMITH_REDIS__PREFIX": s.redis.prefix,
                 "DRAFTSMITH_RUNS_DIR": str(s.runs_dir), "DRAFTSMITH_RUN": s.run, "DRAFTSMITH_STAGE_DIR": "/tmp/stage",
                 "DRAFTSMITH_TARGET__URL": s.target.url, "DRAFTSMITH_GENERATION__MIN_FREE_DISK_GB": "0",
                 "DRAFTSMITH_METRICS__PORT": "0", "PYTHONPATH": str(REPO / "shared"), **host_env(s), **env})
    log = tempfile.TemporaryFile(mode="w+", prefix="draftsmith-host-")
    p = subprocess.Popen(["unshare", "--kill-child", "-m", "-p", "-f", "--mount-proc", "sh", "-c", inner], env=full,
                         stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    p.output_file = log
    return p


def on_host(s, *args: str, env: dict[str, str], timeout: float = 600) -> str:
    """Run one command on a fresh host to its end; returns its output (a failure fails the test with it)."""
    p = start_host(s, *args, env=env)
    out = wait_pool(p, timeout)
    assert p.returncode == 0, out[-4000:]
    return out


def shard_records_raw(records_dir) -> Counter:
    """How many records each prompt has over every sidecar'd shard, duplicates included."""
    c: Counter = Counter()
    for meta in records_dir.iterdir():
        if meta.name.endswith(records_artifact.SIDECAR_SUFFIX):
            c.update(json.loads(meta.read_text())["ids"])
    return c


@pytest.mark.slow
def test_two_hosts_run_every_stage_through_the_object_store_and_survive_losing_one(redis_url, s3_runs, seaweedfs,
                                                                                   embedded_target, tmp_path):
    from draftsmith.target.server import VLLMServer, VLLMServerSpec, free_port

    spec = VLLMServerSpec(model=embedded_target, served_name=MODEL, port=free_port(), enforce_eager=True,
                          kv_cache_gib=1, max_model_len=1024)
    server = VLLMServer(spec, tmp_path / "vllm.log").start(timeout_s=900)
    s = load_settings(None, {
        "runs_dir": s3_runs, "run": "mh", "redis": {"url": redis_url, "prefix": "dstest"},
        "target": {"url": server.url, "model": MODEL},
        "generation": {"max_tokens": 16, "batch_size": 8, "concurrency": 8, "backoff_s": 0.05},
    })
    n = 240
    report = enqueue(s, GSM8K, n, 8, say=lambda m: None)
    assert report.pending == n and len(report.jobs) == n // 8
    records = RunPaths(s.runs_dir, s.run).records
    args = ("worker", "--queues", "generate", "--processes", "1", "--metrics-port", "0")
    host_a = start_host(s, *args, env=seaweedfs.env)
    host_b = start_host(s, *args, env=seaweedfs.env)
    try:
        # kill host A once both hosts have written records and A holds work
        assert wait_for(lambda: len(record_tally(records).ids) >= 64, 300, every=1.0), pool_output(host_a)[-3000:]
        out_a_before = pool_output(host_a)
        assert "records in" in out_a_before, out_a_before[-3000:]  # A finished jobs of its own
        os.killpg(host_a.pid, signal.SIGKILL)  # the namespace's pid 1 dies: every process of host A with it
        host_a.wait(30)
        # host B drains the queue; the jobs A held are orphaned until their heartbeats lapse, then a resume
        # (`draftsmith enqueue` from anywhere) hands them back
        def finished() -> bool:
            if len(record_tally(records).ids) >= n:
                return True
            enqueue(s, None, None, 8, say=lambda m: None)
            return False

        assert wait_for(finished, 420, every=10.0), pool_output(host_b)[-3000:]
    finally:
        out_b = stop_pool(host_b)
        if host_a.poll() is None:
            os.killpg(host_a.pid, signal.SIGKILL)
        server.stop()
    assert "records in" in out_b, out_b[-3000:]
    kept = [r["id"] for r in iter_records(records)]
    assert len(kept) == len(set(kept)) == n  # every prompt exactly once in what the next stage reads
    raw = shard_records_raw(records)
    assert set(raw) == set(kept) and max(raw.values()) == 1, [k for k, v in raw.items() if v > 1]
    resume = enqueue(s, None, None, 8, dry_run=True, say=lambda m: None)  # what a resume would see: nothing left
    assert resume.done == n and resume.pending == 0
    # host A's leases expire within the lease time; host B's were returned as its requests ended
    r = redis.Redis.from_url(redis_url)
    assert wait_for(lambda: InflightCap(r, "dstest", 1).in_flight_all_targets() == 0, 60, every=1.0)
    later_stages_from_the_store(s, n, seaweedfs.env, embedded_target, tmp_path)


def later_stages_from_the_store(s, n: int, store_env: dict[str, str], target, tmp_path) -> None:
    """build-data, extraction jobs on two hosts, training on two nodes (torchrun, c10d, one rank each), export and
    evaluation in vLLM, each on a host of its own that shares only Redis and the store with the others."""
    from draftsmith.artifacts.location import run_location
    from draftsmith.staging import pull
    from draftsmith.target.server import free_port
    from safetensors.torch import load, load_file

    root = run_location(s.runs_dir) / s.run
    # one thread per process everywhere: torchrun gives each of two ranks on one host one thread, and a float sum
    # over another thread count rounds differently, so the two-node run would not be comparable bit for bit
    env = {**store_env, "OMP_NUM_THREADS": "1", "DRAFTSMITH_TARGET__PATH": str(target),
           "DRAFTSMITH_DATA__SHARD_SAMPLES": "32",
           "DRAFTSMITH_DATA__DRAFT_VOCAB_SIZE": "512", "DRAFTSMITH_EXTRACT__BATCH_TOKENS": "2048",
           **{f"DRAFTSMITH_TRAIN__{k.upper()}": str(v) for k, v in TRAIN.items()}}
    out = on_host(s, "build-data", "--run", s.run, env=env)
    data = json.loads((root / "data" / "manifest.json").read_text())
    samples = sum(len(sh["sample_ids"]) for sh in data["shards"])
    assert samples == n and len(data["shards"]) == n // 32 + (n % 32 > 0), out[-2000:]  # every prompt, once

    assert "enqueued" in on_host(s, "extract", "--run", s.run, env=env)
    hosts = [start_host(s, "worker", "--queues", "extract", "--burst", "--processes", "1", env=env) for _ in "ab"]
    outs = [wait_pool(h, 600) for h in hosts]
    assert all(h.returncode == 0 for h in hosts), "\n".join(o[-3000:] for o in outs)
    assert "nothing to do" in on_host(s, "extract", "--run", s.run, env=env)
    feats = json.loads((root / "features" / "manifest.json").read_text())
    assert feats["samples"] == n and len(feats["shards"]) == len(data["shards"])

    rdzv = {**env, "DRAFTSMITH_TRAIN__NNODES": "2", "DRAFTSMITH_TRAIN__RDZV_ENDPOINT": f"127.0.0.1:{free_port()}"}
    nodes = [start_host(s, "train-launch", "--nproc-per-node", "1", env=rdzv, spend_pids=i == 1) for i in (0, 1)]
    outs = [wait_pool(node, 600) for node in nodes]
    assert all(node.returncode == 0 for node in nodes), "\n".join(o[-3000:] for o in outs)
    last = f"step-{TRAIN['max_steps']:08d}"
    two_nodes = load((root / "checkpoints" / last / "model.safetensors").read_bytes())
    # the same data trained on one host, two ranks on a local disk: the same drafter, bit for bit
    local = tmp_path / "one-host" / "runs"
    pull(root, local / s.run, ("data", "features"))
    one = subprocess.run([sys.executable, "-m", "draftsmith", "train-launch", "--nproc-per-node", "2"],
                         env={**os.environ, **env, "DRAFTSMITH_RUNS_DIR": str(local), "DRAFTSMITH_RUN": s.run,
                              "DRAFTSMITH_METRICS__PORT": "0"}, capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stdout[-2000:] + one.stderr[-3000:]
    one_host = load_file(str(local / s.run / "checkpoints" / last / "model.safetensors"))
    assert set(two_nodes) == set(one_host), (sorted(set(two_nodes) ^ set(one_host)), outs[0][-3000:])
    assert all(torch.equal(two_nodes[k], one_host[k]) for k in one_host), [k for k in one_host
                                                                           if not torch.equal(two_nodes[k], one_host[k])]

    on_host(s, "export", "--run", s.run, "--format", "eagle3", env=env)
    served = {**env, "DRAFTSMITH_TARGET__ENFORCE_EAGER": "true", "DRAFTSMITH_TARGET__KV_CACHE_GIB": "1",
              "DRAFTSMITH_TARGET__MAX_MODEL_LEN": "1024"}
    out = on_host(s, "eval", "--run", s.run, "--engine", "vllm", "--sets", "gsm8k", "--limit", "2", "--k", "3",
                  "--max-tokens", "16", "--concurrency", "1", "--no-baseline", env=served)
    report = json.loads((root / "eval" / "report.json").read_text())
    o = report["results"][0]["overall"]
    assert o["drafts"] > 0 and o["draft_tokens"] == 3 * o["drafts"] and o["mean_acceptance_length"] >= 1.0, out[-3000:]


def test_a_worker_without_the_local_run_folder_refuses_its_jobs(tmp_path, redis_url):
    stub = Stub()
    try:
        s = settings_for(tmp_path, redis_url, stub.url)
        report = enqueue(s, GSM8K, 4, 4, say=lambda m: None)
        # the run is under the test's /tmp; this host's /tmp is an empty tmpfs of its own
        host = start_host(s, "worker", "--queues", "generate", "--burst", "--processes", "1", "--metrics-port", "0", env={})
        host.wait(120)
        out = pool_output(host)
    finally:
        stub.close()
    assert host.returncode != 0, out
    assert "is not on this host" in out and "object store" in out, out[-3000:]
    assert "FileNotFoundError" not in out
    # the job is back in the queue for a worker that has the folder, not failed
    from draftsmith.jobqueue.queues import fetch_job

    (jid,) = report.jobs
    assert fetch_job(redis.Redis.from_url(redis_url), jid).get_status() == "queued"


def test_a_host_sees_a_checkout_under_tmp_but_not_the_tests_files(tmp_path, monkeypatch):
    """A clone under /tmp (CI may clone there) stays visible on a host whose /tmp is its own tmpfs; the test's own
    files under /tmp do not."""
    clone = tmp_path / "clone"
    (clone / "shared").mkdir(parents=True)
    (clone / "shared" / "code.py").write_text("code")
    (tmp_path / "runs.txt").write_text("the test's")
    monkeypatch.setattr(sys.modules[__name__], "REPO", clone)
    script = f"{private_tmp()} && cat {clone}/shared/code.py && echo && ls {tmp_path}"
    p = subprocess.run(["unshare", "--kill-child", "-m", "-p", "-f", "--mount-proc", "sh", "-c", script],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["code", "clone"]
