"""A data build for the peer comparison's protocol: regenerated conversations, training data and features of one run.

The default demo's data stages (its prompt mix, config and target: SmolLM2 on vLLM CPU) on ``--prompts`` prompts
split over the bundled pools in the default demo's proportions, each pool taken in file order after skipping the
prompts a build of ``--skip`` prompts took. Two builds with the same ``--prompts`` and ``--skip 0`` / ``--skip N``
therefore share no prompt: the protocol's second build (docs/benchmarks.md, "The fair protocol"). Stops after
extraction; ``bench/peer.py --run runs/RUN`` trains on it. Resumes: a stage already done is skipped.

    .venv/bin/python bench/peer_data.py --run peer-a --prompts 550
    .venv/bin/python bench/peer_data.py --run peer-b --prompts 550 --skip 550
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def pool_counts(total: int, weights: dict[str, int]) -> dict[str, int]:
    """``total`` prompts split over the pools in proportion to ``weights`` (largest remainders; sums to ``total``)."""
    whole = sum(weights.values())
    exact = {p: total * w / whole for p, w in weights.items()}
    out = {p: int(x) for p, x in exact.items()}
    for p in sorted(exact, key=lambda p: exact[p] - out[p], reverse=True)[:total - sum(out.values())]:
        out[p] += 1
    return out


def cut_pools(src: Path, dst: Path, skip: dict[str, int]) -> None:
    """Copy each pool of ``skip`` from ``src`` to ``dst`` without its first ``skip[pool]`` lines."""
    dst.mkdir(parents=True, exist_ok=True)
    for pool, n in skip.items():
        lines = (src / pool).read_text().splitlines(keepends=True)
        if n + 1 > len(lines):
            raise SystemExit(f"{src / pool} has {len(lines)} prompts: --skip takes {n} of them, none left")
        (dst / pool).write_text("".join(lines[n:]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="run name (runs/<run>/)")
    ap.add_argument("--prompts", type=int, required=True, help="prompts in all, over the default demo's pools")
    ap.add_argument("--skip", type=int, default=0, help="skip the prompts a build of this many took (file order)")
    a = ap.parse_args()

    from draftsmith.config import load_settings
    from draftsmith.demo import Demo
    from draftsmith.demo_sizes import SIZES

    base = SIZES["default"]
    counts = pool_counts(a.prompts, base.pools)
    skip = pool_counts(a.skip, base.pools) if a.skip else dict.fromkeys(base.pools, 0)
    s = load_settings()
    prompts = Path(s.runs_dir).resolve() / a.run / "prompts"
    cut_pools(REPO / "data" / "prompts", prompts, skip)
    s = load_settings(None, {"run": a.run, "prompts_dir": str(prompts)})
    size = replace(base, name="peer-data", pools=counts, native_bf16=None)
    demo = Demo(s, size)
    print(f"run {a.run}: {json.dumps(counts)} prompts, after the first {json.dumps(skip)} of each pool", flush=True)
    st = demo.load_state()
    demo.paths.ensure(demo.paths.logs)
    demo.write_config()
    todo = [x for x in ("prepare", "generate", "build-data", "extract") if not st["stages"].get(x, {}).get("done")]
    try:
        for stage in todo:
            if stage == "generate":
                demo.start_server()
            demo._timed(st, stage, getattr(demo, "stage_" + stage.replace("-", "_")))
            if demo.server:
                demo.server.stop()
                demo.server = None
    finally:
        if demo.server:
            demo.server.stop()
    print(f"run {a.run}: " + ", ".join(f"{k} {v['seconds']:.0f} s" for k, v in st["stages"].items()))


if __name__ == "__main__":
    main()
