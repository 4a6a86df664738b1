#!/usr/bin/env python3
"""Does a drafter keep the target's greedy output in vLLM's CPU build? Serve the target alone twice, then with each
drafter, send the same prompts greedily one at a time, and compare the generated token ids with the first run.

    .venv/bin/python scripts/spec-identity.py --target MODELS/Kimi-K2.5-tiny --drafter runs/kimi/drafters/v1 \\
        --trust-remote-code -- --mm-encoder-tp-mode data --language-model-only

Prints one line per engine: answers identical to the target alone, and the first differing token of each answer.
At temperature 0 speculative decoding must not change the target's output; docs/mla.md has what this found on an
MLA target. Every server it starts is stopped before it exits.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from draftsmith.config import load_settings
from draftsmith.evaluation.runner import VLLMClient
from draftsmith.evaluation.sets import load_set
from draftsmith.target.server import VLLMServer, VLLMServerSpec, eagle3_config, free_port


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where ``a`` and ``b`` differ (the shorter one's length if one is a prefix), None
    when they are equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, required=True, help="target checkpoint folder")
    ap.add_argument("--drafter", type=Path, action="append", default=[], help="EAGLE-3 export folder (repeatable)")
    ap.add_argument("--prompts", type=int, default=4, help="first turns of the bundled alpaca set")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=3, help="speculative tokens per step")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--trust-remote-code", action="store_true")
    ap.add_argument("engine_args", nargs="*", help="vLLM arguments after --")
    args = ap.parse_args()
    s = load_settings(None, {})
    prompts = [[{"role": "user", "content": p.turns[0]}] for p in load_set("alpaca", None, s.eval.sets_dir).prompts]
    prompts = prompts[: args.prompts]
    runs = [("target alone", None), ("target alone, again", None), *((str(d), d) for d in args.drafter)]
    ids: dict[str, list[list[int]]] = {}
    with tempfile.TemporaryDirectory(prefix="spec-identity-") as logs:
        for name, drafter in runs:
            spec = VLLMServerSpec(model=args.target, served_name="target", port=free_port(), dtype=args.dtype,
                                  max_model_len=1024, kv_cache_gib=1, enforce_eager=True, max_num_seqs=1,
                                  extra_args=args.engine_args, trust_remote_code=args.trust_remote_code,
                                  speculative=eagle3_config(drafter.resolve(), args.k) if drafter else None)
            with VLLMServer(spec, Path(logs) / f"{len(ids)}.log").start(timeout_s=900) as server:
                client = VLLMClient(server.url, "target", 300.0)
                ids[name] = [list(client.generate(m, args.max_tokens, 0.0).token_ids or ()) for m in prompts]
            if name != "target alone":
                base = ids["target alone"]
                same = sum(a == b for a, b in zip(base, ids[name], strict=True))
                firsts = [first_difference(a, b) for a, b in zip(base, ids[name], strict=True)]
                print(f"{name}: {same}/{len(prompts)} answers identical to the target alone; first differing "
                      f"token {firsts}", flush=True)


if __name__ == "__main__":
    main()
