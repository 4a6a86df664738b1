"""Draft-vocabulary coverage of the target's own eval answers: how the empty slots are filled.

A token outside the draft vocabulary is never drafted, so the share of the target's generated eval tokens inside it
bounds the acceptance of every draft position. This benchmark builds the draft vocabulary of one run's training data
twice for each N, with the same supervised counts:

- baseline: build-data's rule (:func:`draftsmith.data.vocab.build_draft_vocab`): the slots the supervised tokens
  leave empty go to the lowest ids (in a BPE vocabulary the earliest merges);
- candidate (measured here, not adopted: docs/benchmarks.md): they go first to the tokens most frequent over every
  row (prompts too), then to the lowest ids (:func:`prompt_fill_vocab`);

then generates the target's greedy answers (transformers, float32, temperature 0: the tokens vLLM's eval sees) to
the first turn of each bundled eval set and counts the answer tokens inside each vocabulary. Prints a row per
(set, N) and ``RATIO vocab_coverage <candidate / baseline overall coverage at the run's own N>``.

Usage: ``python bench/vocab_coverage.py --run ci-small --sizes 4096,8192 --limit 10 --max-tokens 128``
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]


def run_counts(data_dir: Path, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(supervised counts [V], every-row counts [V])`` over the run's data shards."""
    from draftsmith.artifacts.data import read_manifest
    from draftsmith.data.vocab import count_tokens

    man = read_manifest(data_dir)
    sup = torch.zeros(vocab_size, dtype=torch.int64)
    every = torch.zeros(vocab_size, dtype=torch.int64)
    for sh in man["shards"]:
        t = load_file(str(data_dir / sh["file"]))
        sup += count_tokens(t["input_ids"], t["loss_mask"], vocab_size)
        every += count_tokens(t["input_ids"], torch.ones_like(t["loss_mask"]), vocab_size)
    return sup, every


def prompt_fill_vocab(counts: torch.Tensor, every: torch.Tensor, n: int) -> torch.Tensor:
    """``t2d`` ``[V]`` of the candidate rule: top-``n`` by supervised count, then by count over every row, then id."""
    import numpy as np

    order = np.lexsort((np.arange(counts.numel()), -every.numpy(), -counts.numpy()))  # last key sorts first
    t2d = torch.zeros(counts.numel(), dtype=torch.bool)
    t2d[torch.from_numpy(order[:n].copy())] = True
    return t2d


@torch.no_grad()
def greedy_answers(target: Path, prompts: list[str], max_tokens: int, batch: int = 8) -> list[list[int]]:
    """The target's greedy answer ids to each prompt (chat template of the tokenizer, end-of-turn included)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(target))
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    out: list[list[int]] = []
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    for s in range(0, len(prompts), batch):
        texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
                 for p in prompts[s : s + batch]]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        gen = model.generate(**enc, max_new_tokens=max_tokens, do_sample=False, eos_token_id=eos,
                             pad_token_id=tok.pad_token_id or eos)  # [b, P + new]
        for row in gen[:, enc["input_ids"].shape[1] :].tolist():
            out.append(row[: row.index(eos) + 1] if eos in row else row)
    return out


def main() -> None:
    from draftsmith.data.vocab import build_draft_vocab
    from draftsmith.evaluation.sets import load_set
    from draftsmith.target.embedded import prepare_embedded

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True)
    ap.add_argument("--runs-dir", default=str(REPO / "runs"))
    ap.add_argument("--sizes", default="4096,8192")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "draftsmith"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    target = prepare_embedded(Path(a.cache_dir))
    data_dir = Path(a.runs_dir) / a.run / "data"
    from draftsmith.artifacts.data import read_manifest

    vocab_size = int(read_manifest(data_dir)["target_vocab_size"])
    sup, every = run_counts(data_dir, vocab_size)
    print(f"run {a.run}: {int(sup.sum())} supervised tokens ({int((sup > 0).sum())} distinct), "
          f"{int(every.sum())} tokens in all ({int((every > 0).sum())} distinct)")
    sets = ["mt_bench", "gsm8k", "humaneval", "alpaca"]
    answers: dict[str, list[int]] = {}
    t0 = time.time()
    for name in sets:
        es = load_set(name, limit=a.limit)
        answers[name] = [i for ids in greedy_answers(target, [p.turns[0] for p in es.prompts], a.max_tokens)
                         for i in ids]
    print(f"greedy answers: {sum(len(v) for v in answers.values())} tokens in {time.time() - t0:.0f} s "
          f"({a.limit} first turns per set, up to {a.max_tokens} tokens)")
    print(f"{'N':>6} {'set':<10} {'lowest-id fill':>14} {'prompt fill':>12}")
    ratio = None
    for n in (int(x) for x in a.sizes.split(",")):
        masks = {"base": build_draft_vocab(sup, n)[1], "cand": prompt_fill_vocab(sup, every, n)}
        tot = {"base": 0, "cand": 0}
        count = 0
        for name in sets:
            ids = torch.tensor(answers[name], dtype=torch.long)
            cov = {k: float(m[ids].float().mean()) for k, m in masks.items()}
            for k in tot:
                tot[k] += int(masks[k][ids].sum())
            count += ids.numel()
            print(f"{n:>6} {name:<10} {cov['base']:>14.4f} {cov['cand']:>12.4f}")
        b, c = tot["base"] / count, tot["cand"] / count
        print(f"{n:>6} {'overall':<10} {b:>14.4f} {c:>12.4f}")
        if ratio is None:
            ratio = c / b
    print(f"RATIO vocab_coverage {ratio:.3f}")


if __name__ == "__main__":
    main()
