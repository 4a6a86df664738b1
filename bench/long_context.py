"""Training at long sequence lengths end to end on the embedded target, through the real stages.

Long samples are made by joining conversations: consecutive GSM8K train questions and their reference solutions
(``data/prompts/gsm8k_train.jsonl``, MIT licence) become one multi-turn conversation of about ``--length`` tokens
under SmolLM2's chat template, written as generation records (the answers are the dataset's, not the target's:
this measures capacity and speed, not acceptance). Then, as a user runs them: ``draftsmith build-data``
(``data.max_length = --length``), ``draftsmith extract --sync`` (the real target, hf backend) and
``draftsmith train`` for ``--steps`` optimizer steps, one sample per micro-batch. Prints the trainer's progress
lines (loss, accuracy, grad norm, tokens/s, peak memory, MFU where the device's peak is known) and a summary:

    LONG_CONTEXT tokens_per_sample <T> steps <n> step_s <median> peak_gb <peak>

    .venv/bin/python bench/long_context.py [--length 8192 --samples 6 --steps 4]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECORD_SCHEMA = "draftsmith.record/1"


def joined_conversations(tok, length: int, samples: int) -> list[list[dict[str, str]]]:
    """``samples`` conversations of consecutive GSM8K question/answer turns, each just under ``length`` tokens."""
    rows = [json.loads(x) for x in (REPO / "data" / "prompts" / "gsm8k_train.jsonl").read_text().splitlines()]
    out: list[list[dict[str, str]]] = []
    i = 0
    while len(out) < samples and i < len(rows):
        conv: list[dict[str, str]] = []
        while i < len(rows):
            turn = [{"role": "user", "content": rows[i]["question"]}, {"role": "assistant", "content": rows[i]["answer"]}]
            n = len(tok.apply_chat_template(conv + turn, tokenize=True, return_dict=True)["input_ids"])
            if n > length - 16:
                break
            conv += turn
            i += 1
        out.append(conv)
    return out


def write_records(records: Path, convs: list[list[dict[str, str]]], model: str) -> None:
    from draftsmith.generation.store import write_shard

    recs = []
    for k, conv in enumerate(convs):
        turns = [{"finish_reason": "stop", "usage": {}, "token_ids": None, "prompt_token_ids": None,
                  "reasoning_field": None, "latency_s": 0.0} for m in conv if m["role"] == "assistant"]
        recs.append({"schema": RECORD_SCHEMA, "id": f"long{k:04d}", "status": "ok", "error": None, "model": model,
                     "messages": [{**m, "reasoning": None} if m["role"] == "assistant" else m for m in conv],
                     "turns": turns, "sampling": {"temperature": 0.0}})
    write_shard(records, "long", recs)


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "draftsmith", *args], env=env, capture_output=True, text=True,
                       timeout=7200)
    if p.returncode != 0:
        raise SystemExit(f"draftsmith {' '.join(args)} failed ({p.returncode}):\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    return p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=8192, help="tokens per joined sample (data.max_length)")
    ap.add_argument("--samples", type=int, default=6)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--ttt-steps", type=int, default=3)
    ap.add_argument("--draft-vocab-size", type=int, default=4096)
    ap.add_argument("--keep", type=Path, help="keep the run under this folder instead of a temporary one")
    a = ap.parse_args()
    from draftsmith.config import load_settings
    from draftsmith.data.render import load_tokenizer
    from draftsmith.target.embedded import embedded_dir

    target = embedded_dir(load_settings().target.cache_dir)
    runs = a.keep or Path(tempfile.mkdtemp(prefix="bench-long-"))
    env = {**os.environ, "DRAFTSMITH_RUNS_DIR": str(runs), "DRAFTSMITH_TARGET__PATH": str(target),
           "DRAFTSMITH_DATA__MAX_LENGTH": str(a.length), "DRAFTSMITH_DATA__DRAFT_VOCAB_SIZE": str(a.draft_vocab_size),
           "DRAFTSMITH_TRAIN__BATCH_TOKENS": str(a.length),
           "DRAFTSMITH_TRAIN__BATCH_SIZE": "1", "DRAFTSMITH_TRAIN__LOG_EVERY": "1", "DRAFTSMITH_TRAIN__EVAL_FRACTION": "0",
           "DRAFTSMITH_EXTRACT__BATCH_TOKENS": str(a.length)}
    try:
        tok = load_tokenizer(target)
        convs = joined_conversations(tok, a.length, a.samples)
        write_records(runs / "long" / "records", convs, target.name)
        t0 = time.time()
        cli("build-data", "--run", "long", env=env)
        man = json.loads((runs / "long" / "data" / "manifest.json").read_text())
        lengths = [n for sh in man["shards"] for n in sh["lengths"]]
        print(f"data: {len(lengths)} samples of {min(lengths)}-{max(lengths)} tokens ({time.time() - t0:.0f} s)")
        t0 = time.time()
        cli("extract", "--run", "long", "--sync", env=env)
        print(f"extract: {sum(lengths):,} tokens in {time.time() - t0:.0f} s")
        t0 = time.time()
        p = cli("train", "--run", "long", "--max-steps", str(a.steps), "--ttt-steps", str(a.ttt_steps), env=env)
        wall = time.time() - t0
    finally:
        if not a.keep:
            shutil.rmtree(runs, ignore_errors=True)
    lines = [x for x in p.stderr.splitlines() if re.search(r"step +\d+/", x)]
    for x in lines:
        print(x.split("INFO", 1)[-1].strip())
    secs = [float(m.group(1)) for x in lines if (m := re.search(r"step_s ([\d.]+)", x))]
    peaks = [float(m.group(1)) for x in lines if (m := re.search(r"peak_mem ([\d.]+) GB", x))]
    print(f"train: {a.steps} steps in {wall:.0f} s (process start, load and final save included)")
    print(f"LONG_CONTEXT tokens_per_sample {max(lengths)} steps {a.steps} "
          f"step_s {statistics.median(secs) if secs else float('nan'):.1f} peak_gb {max(peaks, default=float('nan')):.2f}")


if __name__ == "__main__":
    main()
