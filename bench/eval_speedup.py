"""Benchmark: output tokens/s of vLLM CPU with an EAGLE-3 drafter (candidate) vs without (baseline).

Both servers are started here with the same settings (float32, enforce-eager), one after the other, and fed the
same prompts at the same concurrency through `draftsmith eval`'s own runner; the ratio is the report's `speedup`.
With the default random drafter nothing is accepted, so the ratio is the pure cost of drafting and verifying
K tokens per step on this CPU (pass --drafter DIR for a trained one).

    .venv/bin/python bench/eval_speedup.py [--limit 4] [--max-tokens 32] [--drafter DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=4, help="GSM8K questions")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--drafter", type=Path, default=None)
    args = ap.parse_args()

    from draftsmith.config import load_settings
    from draftsmith.evaluation.evaluate import run_evaluation
    from draftsmith.log import setup_logging
    from draftsmith.target.embedded import embedded_dir

    setup_logging("INFO")
    target = embedded_dir(Path.home() / ".cache" / "draftsmith")
    work = Path(tempfile.mkdtemp(prefix="bench-eval-"))
    drafter = args.drafter
    if drafter is None:
        spec = importlib.util.spec_from_file_location(
            "rec", REPO / "tests" / "fixtures" / "evaluation" / "record_vllm_spec.py")
        rec = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(rec)
        drafter = rec.write_random_drafter(target, work / "drafter")
    s = load_settings(overrides={
        "runs_dir": str(work / "runs"), "run": "bench",
        "target": {"path": str(target), "enforce_eager": True, "kv_cache_gib": 1, "max_model_len": 1024},
        "eval": {"engine": "vllm", "k": args.k, "sets": ["gsm8k"], "limit": args.limit, "drafter": str(drafter),
                 "concurrency": args.concurrency, "max_tokens": args.max_tokens, "baseline": True},
    })
    paths = run_evaluation(s)
    o = json.loads(paths["json"].read_text())["results"][0]["overall"]
    print(f"baseline {o['baseline_output_tokens_per_s']} tok/s, candidate (drafter, K={args.k}) "
          f"{o['output_tokens_per_s']} tok/s, mean acceptance length {o['mean_acceptance_length']}")
    print(f"RATIO eval_speedup {o['speedup']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
