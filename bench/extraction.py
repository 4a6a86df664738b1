"""Extraction throughput vs a bare forward pass of the same model over the same batches, in one process.

Baseline: ``model.model(input_ids, attention_mask)`` (no hooks, nothing kept) over the batch plan of every shard.
Candidate: ``extract_shard`` (read the data shard, hooks on three layers, cast to bf16, NaN/Inf check, write the
safetensors shard and sidecar, rebuild the manifest and status). Each is run ``--repeats`` times alternately; the
best time of each counts. Also prints stored bytes per token against the arithmetic minimum (3 + 1) * H * 2.

    .venv/bin/python bench/extraction.py --samples 16 --length 128
Last line: ``RATIO extraction <candidate tokens/s / baseline tokens/s>`` (goal >= 0.90).
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import tempfile
import time
from pathlib import Path

import torch
from draftsmith.artifacts import data as data_artifact
from draftsmith.config import load_settings
from draftsmith.features.hf import plan_batches
from draftsmith.features.jobs import extract_shard, get_extractor
from draftsmith.features.plan import make_plan, read_data_shard
from draftsmith.target.embedded import embedded_dir
from safetensors.torch import save_file


def write_data(run_dir: Path, target: Path, samples: int, length: int, shard_samples: int, seed: int = 0) -> None:
    """Random-token samples (lengths length/2..length) in the data format of formats.md §3."""
    g = torch.Generator().manual_seed(seed)
    data = run_dir / "data"
    data.mkdir(parents=True)
    shards = []
    for si in range(0, samples, shard_samples):
        lens = torch.randint(length // 2, length + 1, (min(shard_samples, samples - si),), generator=g).tolist()
        ids = torch.randint(3, 49152, (sum(lens),), generator=g, dtype=torch.int32)
        off = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int64)
        f = data / data_artifact.shard_file(si // shard_samples)
        save_file({"input_ids": ids, "loss_mask": torch.ones(sum(lens), dtype=torch.uint8), "offsets": off}, str(f))
        shards.append({"file": f.name, "sample_ids": [f"s{si + k}" for k in range(len(lens))], "lengths": lens,
                       "sha256": hashlib.sha256(f.read_bytes()).hexdigest()})
    from draftsmith.data.render import load_tokenizer, tokenizer_sha256

    tok_sha = tokenizer_sha256(load_tokenizer(target), target)
    data_artifact.write_manifest(data, {
        "schema": data_artifact.DATA_SCHEMA, "tokenizer": {"path": str(target), "sha256": tok_sha},
        "target_model": target.name, "max_length": length, "shards": shards, "config": {}})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--shard-samples", type=int, default=8)
    ap.add_argument("--batch-tokens", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tmp = Path(tempfile.mkdtemp(prefix="bench-extract-"))
    try:
        s0 = load_settings(overrides={"runs_dir": str(tmp), "run": "b"})
        target = embedded_dir(s0.target.cache_dir)
        write_data(tmp / "b", target, a.samples, a.length, a.shard_samples)
        s = load_settings(overrides={"runs_dir": str(tmp), "run": "b", "target": {"path": str(target)},
                                     "extract": {"batch_tokens": a.batch_tokens}})
        plan = make_plan(s, tmp / "b")
        x = get_extractor(plan, s)
        shards = [read_data_shard(plan.data_dir, e) for e in plan.shards]
        tokens = sum(sum(e["lengths"]) for e in plan.shards)

        def baseline() -> float:
            t0 = time.perf_counter()
            with torch.no_grad():
                for seqs in shards:
                    for b in plan_batches([q.numel() for q in seqs], a.batch_tokens):
                        lens = [seqs[i].numel() for i in b]
                        ids = torch.zeros(len(b), max(lens), dtype=torch.long)
                        mask = torch.zeros_like(ids)
                        for r, i in enumerate(b):
                            ids[r, : lens[r]] = seqs[i]
                            mask[r, : lens[r]] = 1
                        x.base(input_ids=ids, attention_mask=mask, use_cache=False)
            return time.perf_counter() - t0

        def candidate() -> float:
            shutil.rmtree(plan.features_dir, ignore_errors=True)
            t0 = time.perf_counter()
            for i in range(len(plan.shards)):
                extract_shard(plan, i, x)
            return time.perf_counter() - t0

        baseline()  # warm-up
        tb, tc = [], []
        for _ in range(a.repeats):
            tb.append(baseline())
            tc.append(candidate())
        written = sum(f.stat().st_size for f in plan.features_dir.glob("features-*.safetensors"))
        b_tps, c_tps = tokens / min(tb), tokens / min(tc)
        print(f"samples {a.samples}, tokens {tokens}, shards {len(plan.shards)}, batch_tokens {a.batch_tokens}, "
              f"threads {a.threads}")
        print(f"bare forward:  {b_tps:8.1f} tokens/s (best of {a.repeats}: {min(tb):.2f} s)")
        print(f"extraction:    {c_tps:8.1f} tokens/s (best of {a.repeats}: {min(tc):.2f} s)")
        print(f"bytes/token:   {written / tokens:8.1f} stored vs {plan.bytes_per_token()} minimum "
              f"((3 + 1) x {plan.hidden_size} x 2)")
        print(f"RATIO extraction {c_tps / b_tps:.3f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
