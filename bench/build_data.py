"""Benchmark: ``build-data`` (render with the chat template, mask, validate, pack, draft vocab) against plain
``tokenizer(...)`` over the same rendered texts, in one process, with the real SmolLM2 tokenizer.

Records: GSM8K train questions with their reference answers standing in for the target's output (token ids
included, so validation runs too). Throughput excludes loading the tokenizer on both sides; best of ``--repeats`` interleaved runs each.

    .venv/bin/python bench/build_data.py [--records 2000]

Last line: ``RATIO build_data <build samples/s / tokenizer samples/s>`` (goal >= 0.5).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from draftsmith.artifacts.records import RECORD_SCHEMA
from draftsmith.config import DataConfig
from draftsmith.data.build import build_data
from draftsmith.data.render import load_tokenizer
from draftsmith.target.embedded import embedded_dir

PROMPTS = Path(__file__).resolve().parents[1] / "data" / "prompts" / "gsm8k_train.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--prompts", type=Path, default=PROMPTS)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    folder = embedded_dir(Path.home() / ".cache" / "draftsmith")
    tok = load_tokenizer(folder)
    rows = [json.loads(line) for line in args.prompts.read_text().splitlines()[: args.records]]
    records, texts = [], []
    for i, row in enumerate(rows):
        msgs = [{"role": "user", "content": row["question"]}, {"role": "assistant", "content": row["answer"]}]
        ids = tok(row["answer"] + "<|im_end|>", add_special_tokens=False)["input_ids"]
        records.append({"schema": RECORD_SCHEMA, "id": f"{i:016x}", "status": "ok", "error": None,
                        "model": folder.name, "messages": [{**m, "reasoning": None} for m in msgs],
                        "turns": [{"finish_reason": "stop", "usage": {}, "token_ids": ids, "reasoning_field": None,
                                   "latency_s": 0.0}], "sampling": {}, "job_id": "bench", "created_at": ""})
        texts.append(tok.apply_chat_template(msgs, tokenize=False))

    base_s, build_s, st = float("inf"), float("inf"), {}
    with tempfile.TemporaryDirectory() as d:
        rec_dir = Path(d) / "records"
        rec_dir.mkdir()
        (rec_dir / "bench.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        for _ in range(args.repeats):  # interleaved, best of N: the machine is shared
            t = time.perf_counter()
            enc = tok(texts, add_special_tokens=False)["input_ids"]
            base_s = min(base_s, time.perf_counter() - t)
            st = build_data(rec_dir, Path(d) / "data", folder, DataConfig(draft_vocab_size=8192), folder.name).stats
            build_s = min(build_s, st["seconds"] - st["load_seconds"])
    base_tokens = sum(map(len, enc))
    assert st["tokens"] == base_tokens, (st["tokens"], base_tokens)  # same texts, same tokens
    base_rate, build_rate = len(texts) / base_s, st["samples"] / build_s
    print(f"records {len(texts)}  tokens {base_tokens}  supervised {st['supervised_tokens']}")
    print(f"tokenizer(...)  {base_s:7.3f} s  {base_rate:9.1f} samples/s  {base_tokens / base_s:11.0f} tokens/s")
    print(f"build-data      {build_s:7.3f} s  {build_rate:9.1f} samples/s  {st['tokens'] / build_s:11.0f} tokens/s")
    print(f"RATIO build_data {build_rate / base_rate:.3f}")


if __name__ == "__main__":
    main()
