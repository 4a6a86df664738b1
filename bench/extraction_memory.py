"""Peak resident memory of extracting one shard of 8x the samples against one of 1x, same budget.

Each shard (random-token samples, bench/extraction.py's ``write_data``; lengths ``--length``/2..``--length``) is
extracted by ``extract_shard`` in a fresh process on the embedded SmolLM2 target with the ``hf`` backend; its peak
resident memory is the child's ``ru_maxrss`` (``getrusage`` of itself, read as it exits), which counts the interpreter, torch and the target as
well as the features. The child also reports its resident memory once the target is loaded, before extracting, so
the lines show what the features themselves add.

    .venv/bin/python bench/extraction_memory.py [--samples 32 --factor 8 --length 512 --write-tokens 4096]

Last line: ``RATIO extraction_memory_growth <peak(8x) / peak(1x)>`` (goal <= 1.3: memory follows the budget
``extract.write_tokens``, not ``data.shard_samples``).

``--no-budget`` leaves ``extract.write_tokens`` unset (sized from the free memory: the whole shard here);
``--code DIR`` imports draftsmith from another checkout's ``shared/`` in the children (e.g. the main branch's, for
the number before the budget existed; implies ``--no-budget``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def child(runs: Path, batch_tokens: int, write_tokens: int, threads: int, compute_dtype: str) -> None:
    """In a fresh process: load the target, extract data shard 0 of ``runs/b``; prints one ``RESULT`` JSON line."""
    import resource
    import time

    import psutil
    import torch
    from draftsmith.config import load_settings
    from draftsmith.features.jobs import extract_shard, get_extractor
    from draftsmith.features.plan import make_plan
    from draftsmith.target.embedded import embedded_dir

    torch.set_num_threads(threads)
    target = embedded_dir(load_settings().target.cache_dir)
    extract = {"batch_tokens": batch_tokens, "compute_dtype": compute_dtype,
               **({"write_tokens": write_tokens} if write_tokens else {})}
    s = load_settings(overrides={"runs_dir": str(runs), "run": "b", "target": {"path": str(target)},
                                 "extract": extract})
    plan = make_plan(s, runs / "b")
    x = get_extractor(plan, s)
    loaded = psutil.Process().memory_info().rss
    t0 = time.perf_counter()
    res = extract_shard(plan, 0, x)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    print("RESULT " + json.dumps({"tokens": res["tokens"], "samples": res["samples"], "bytes": res["bytes"],
                                  "seconds": seconds, "loaded_rss": loaded, "peak_rss": peak}), flush=True)


def measure(runs: Path, a) -> dict:
    """Run :func:`child` on ``runs`` in a fresh process; its result (``peak_rss``: its ``ru_maxrss`` in bytes)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    if a.code:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(a.code).resolve()), env.get("PYTHONPATH")]))
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # leave the other checkout as it was
    cmd = [sys.executable, __file__, "--child", str(runs), "--batch-tokens", str(a.batch_tokens),
           "--write-tokens", str(0 if a.no_budget or a.code else a.write_tokens), "--threads", str(a.threads), "--compute-dtype", a.compute_dtype]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise SystemExit(f"extraction child failed ({p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-3000:]}")
    line = next(x for x in p.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=32, help="samples of the 1x shard")
    ap.add_argument("--factor", type=int, default=8, help="the large shard has this many times the samples")
    ap.add_argument("--length", type=int, default=512, help="longest sample, in tokens (shortest: half of it)")
    ap.add_argument("--batch-tokens", type=int, default=2048, help="extract.batch_tokens (per forward pass)")
    ap.add_argument("--write-tokens", type=int, default=4096, help="extract.write_tokens (per write)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compute-dtype", default="auto", help="extract.compute_dtype (auto: bf16 on AMX)")
    ap.add_argument("--no-budget", action="store_true", help="leave extract.write_tokens unset")
    ap.add_argument("--code", help="a checkout's shared/ folder to import draftsmith from in the children")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.batch_tokens, a.write_tokens, a.threads, a.compute_dtype)
    from draftsmith.config import load_settings
    from draftsmith.target.embedded import embedded_dir

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from extraction import write_data  # the sibling benchmark's data writer

    target = embedded_dir(load_settings().target.cache_dir)
    tmp = Path(tempfile.mkdtemp(prefix="bench-extract-memory-"))
    res = {}
    try:
        for k in (1, a.factor):
            n = a.samples * k
            write_data(tmp / f"x{k}" / "b", target, n, a.length, n)
            res[k] = measure(tmp / f"x{k}", a)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    budget = "unset (whole shard)" if a.no_budget or a.code else f"{a.write_tokens} tokens"
    print(f"hf backend on CPU, compute {a.compute_dtype}, {a.threads} threads, batch_tokens {a.batch_tokens}, write budget {budget}"
          + (f", code from {a.code}" if a.code else ""))
    for k, r in res.items():
        print(f"{k}x: {r['samples']} samples, {r['tokens']} tokens, {r['bytes'] / 1e6:.0f} MB of features in "
              f"{r['seconds']:.1f} s; RSS with the target loaded {r['loaded_rss'] / 2**20:.0f} MiB, "
              f"peak {r['peak_rss'] / 2**20:.0f} MiB (+{(r['peak_rss'] - r['loaded_rss']) / 2**20:.0f} MiB)")
    print(f"RATIO extraction_memory_growth {res[a.factor]['peak_rss'] / res[1]['peak_rss']:.3f}")


if __name__ == "__main__":
    main()
