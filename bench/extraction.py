"""Extraction throughput vs a bare forward pass of the same model over the same batches, in one process.

Baseline: ``model.model(input_ids, attention_mask)`` (no hooks, nothing kept) over the batch plan of every shard.
Candidate: ``extract_shard`` (read the data shard, hooks on three layers, cast to bf16, NaN/Inf check, write the
safetensors shard and sidecar, rebuild the manifest and status). Each is run ``--repeats`` times alternately; the
best time of each counts. Also prints stored bytes per token against the arithmetic minimum (3 + 1) * H * 2.

    .venv/bin/python bench/extraction.py --samples 16 --length 128
Last line: ``RATIO extraction <candidate tokens/s / baseline tokens/s>`` (goal >= 0.90).

``--vllm``: the vllm backend against vLLM's own prefill of the same token ids. Baseline: ``LLM.generate`` of every
sample with ``max_tokens=1`` (a prefill and one sampled token), no extraction configured. Candidate:
``VLLMExtractor.extract`` (the same prefill with the ``extract_hidden_states`` method and draftsmith's connector,
the files written and read back, the final norm applied). Each engine in a process of its own (one vLLM engine per
process), same engine settings (eager, prefix caching off, float32 on a CPU without AMX), each timed best of
``--repeats`` after one warm-up pass. Last line: ``RATIO extraction_vs_prefill <extraction tok/s / prefill tok/s>``
(goal >= 0.9: extraction is a prefill plus copying out 4 hidden states per token).
"""

from __future__ import annotations

import argparse
import hashlib
import os
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
    """Random-token samples (lengths length/2..length, ids below the target's vocabulary size) in the data format
    of formats.md §3."""
    import json

    g = torch.Generator().manual_seed(seed)
    cfg = json.loads((target / "config.json").read_text())
    vocab = int(cfg.get("text_config", cfg)["vocab_size"])  # ids of the target's own vocabulary
    data = run_dir / "data"
    data.mkdir(parents=True)
    shards = []
    for si in range(0, samples, shard_samples):
        lens = torch.randint(length // 2, length + 1, (min(shard_samples, samples - si),), generator=g).tolist()
        ids = torch.randint(3, vocab, (sum(lens),), generator=g, dtype=torch.int32)
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


def _vllm_worker(mode: str, runs: Path, batch_tokens: int, repeats: int) -> None:
    """In a fresh process: time ``mode`` (``prefill`` or ``extract``) over every data shard; prints one JSON line."""
    import json

    s = load_settings(overrides={"runs_dir": str(runs), "run": "b", "target": {"path": str(_target())},
                                 "extract": {"batch_tokens": batch_tokens, "backend": "vllm"}})
    plan = make_plan(s, runs / "b")
    seqs = [q for e in plan.shards for q in read_data_shard(plan.data_dir, e)]
    tokens = sum(q.numel() for q in seqs)
    from draftsmith.features.vllm_backend import VLLMExtractor

    if mode == "extract":
        x = VLLMExtractor.from_plan(plan, s)
        run = lambda: x.extract(seqs)  # noqa: E731
    else:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from draftsmith.target.server import cpu_env

        os.environ.update({k: v for k, v in cpu_env(kv_cache_gib=s.target.kv_cache_gib).items()
                           if k.startswith(("VLLM_", "HF_", "TRANSFORMERS_", "DO_NOT"))})
        from vllm import LLM, SamplingParams

        tp = s.extract.tensor_parallel_size  # the same split as the extraction engine
        llm = LLM(model=plan.target_dir, dtype=plan.compute_dtype, enforce_eager=True,
                  max_model_len=max(max(len(q) for q in seqs) + 8, 256), enable_prefix_caching=False, seed=0,
                  tensor_parallel_size=tp, **({"distributed_executor_backend": "mp"} if tp > 1 else {}))
        prompts = [{"prompt_token_ids": [int(t) for t in q]} for q in seqs]
        run = lambda: llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)  # noqa: E731
    run()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    print("RESULT " + json.dumps({"mode": mode, "tokens": tokens, "seconds": min(times)}), flush=True)


def _target() -> Path:
    return embedded_dir(load_settings().target.cache_dir)


def vllm_main(a) -> None:
    """``--vllm``: extraction through the vllm backend against vLLM's own prefill (see the module docstring)."""
    import json
    import subprocess
    import sys

    tmp = Path(tempfile.mkdtemp(prefix="bench-extract-vllm-"))
    try:
        write_data(tmp / "b", _target(), a.samples, a.length, a.shard_samples)
        res = {}
        for mode in ("prefill", "extract"):
            p = subprocess.run([sys.executable, __file__, "--vllm-worker", mode, "--runs", str(tmp),
                                "--batch-tokens", str(a.batch_tokens), "--repeats", str(a.repeats)],
                               capture_output=True, text=True, timeout=3600)
            line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
            if p.returncode != 0 or line is None:
                raise SystemExit(f"{mode} failed ({p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-3000:]}")
            res[mode] = json.loads(line[7:])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    tps = {m: r["tokens"] / r["seconds"] for m, r in res.items()}
    print(f"samples {a.samples}, tokens {res['prefill']['tokens']}, vLLM engine in-process, eager, "
          f"best of {a.repeats}")
    print(f"vLLM prefill (max_tokens=1): {tps['prefill']:8.1f} tokens/s ({res['prefill']['seconds']:.2f} s)")
    print(f"vllm backend extraction:     {tps['extract']:8.1f} tokens/s ({res['extract']['seconds']:.2f} s)")
    print(f"RATIO extraction_vs_prefill {tps['extract'] / tps['prefill']:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--shard-samples", type=int, default=8)
    ap.add_argument("--batch-tokens", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vllm", action="store_true", help="the vllm backend against vLLM's own prefill")
    ap.add_argument("--vllm-worker", choices=["prefill", "extract"], help=argparse.SUPPRESS)
    ap.add_argument("--runs", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.vllm_worker:
        return _vllm_worker(a.vllm_worker, a.runs, a.batch_tokens, a.repeats)
    if a.vllm:
        return vllm_main(a)
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
