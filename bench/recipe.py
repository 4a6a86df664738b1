"""Recipe ablations: train several drafter recipes on one run's data and features, then measure each in vLLM.

Every variant trains from scratch on the same ``runs/<run>/data`` and ``runs/<run>/features`` (symlinked into a
run of its own, ``runs/<run>--<variant>``), with the same seed and the same budget (``--epochs`` passes, or
``--max-steps`` optimizer steps), then is exported and measured in a real vLLM CPU server (K = ``--k``, T = 0) on
the bundled eval sets. The first variant is the baseline; every row is reported against it.

Reported per variant: held-out simulated acceptance length and per-step accuracy (from training's held-out split),
mean acceptance length in vLLM overall and per set (``1 + accepted / drafts``, bonus token counted), training
seconds. Results go to ``runs/<run>/ablation.json`` and ``runs/<run>/ablation.md``; the last line is
``RATIO recipe <best vLLM acceptance length / baseline's>``.

Variants file (YAML)::

    - name: baseline
      train: {}
    - name: norm-before-residual
      train: {norm_before_residual: true}

Usage: ``python bench/recipe.py --run demo --variants bench/recipes/ablation.yaml --epochs 2 --eval-limit 5``
(``--only a,b`` runs some variants; finished variants are kept and skipped unless ``--redo``;
``--baseline-from-run`` takes the first row from the run's own training and eval when the run's recipe is the
baseline).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from draftsmith.artifacts.report import read_report

REPO = Path(__file__).resolve().parents[1]


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _draftsmith(args: list[str], config: Path, log: Path) -> None:
    """Run ``draftsmith <args>`` with ``config``; output to ``log``. Raises RuntimeError with the log tail."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTSMITH_")}
    env["DRAFTSMITH_CONFIG"] = str(config)
    if os.environ.get("DRAFTSMITH_REDIS__URL"):
        env["DRAFTSMITH_REDIS__URL"] = os.environ["DRAFTSMITH_REDIS__URL"]
    with open(log, "a") as f:
        p = subprocess.run([sys.executable, "-m", "draftsmith", *args], env=env, stdout=f, stderr=subprocess.STDOUT)
    if p.returncode != 0:
        raise RuntimeError(f"`draftsmith {' '.join(args)}` failed ({p.returncode}): "
                           + "".join(log.read_text().splitlines(True)[-15:]))


def run_variant(base_cfg: dict[str, Any], runs_dir: Path, run: str, v: dict[str, Any], a) -> dict[str, Any]:
    """Train, export and evaluate one variant; returns its figures."""
    name = v["name"]
    vrun = f"{run}--{name}"
    root = runs_dir / vrun
    root.mkdir(parents=True, exist_ok=True)
    for sub in ("data", "features"):
        link = root / sub
        if not link.exists():
            link.symlink_to((runs_dir / run / sub).resolve())
    train = {"seed": a.seed, "resume": False, "save_every": 100000}
    if a.max_steps:
        train["max_steps"] = a.max_steps
    if a.epochs:
        train["epochs"] = a.epochs
    cfg = _deep_merge(base_cfg, {"run": vrun, "runs_dir": str(runs_dir.resolve()), "train": train,
                                 "eval": {"limit": a.eval_limit, "k": a.k, "baseline": False,
                                          "max_tokens": a.max_tokens, "temperature": 0.0}})
    cfg = _deep_merge(cfg, {"train": v.get("train", {})})
    cfg_file = root / "recipe-config.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg, sort_keys=False))
    log = root / "recipe.log"
    t0 = time.time()
    _draftsmith(["train", "--run", vrun, "--no-resume"], cfg_file, log)
    train_s = time.time() - t0
    out: dict[str, Any] = {"name": name, "train": v.get("train", {}), "train_s": round(train_s, 1),
                           **training_figures(root / "status" / "train.json")}
    _draftsmith(["export", "--run", vrun, "--format", "eagle3"], cfg_file, log)
    if not a.no_vllm:
        _draftsmith(["eval", "--run", vrun, "--engine", "vllm", "--no-baseline"], cfg_file, log)
        out["vllm"] = vllm_figures(root / "eval")
    (root / "recipe-result.json").write_text(json.dumps(out, indent=1))
    return out


def training_figures(snap_file: Path) -> dict[str, Any]:
    """Optimizer steps and the final train / held-out figures of a finished training (its ``status/train.json``)."""
    snap = json.loads(snap_file.read_text())
    return {"steps": snap.get("step"), "heldout": snap.get("heldout"), "train_split": snap.get("train")}


def vllm_figures(eval_dir: Path) -> dict[str, Any] | None:
    """Overall and per-set mean acceptance length of the first engine in ``eval_dir``'s report (None: no report)."""
    rep = read_report(eval_dir)
    if rep is None:
        return None
    eng = rep["results"][0]
    return {"overall": eng["overall"]["mean_acceptance_length"],
            "sets": {k: m["mean_acceptance_length"] for k, m in eng["sets"].items()},
            "per_position": eng["overall"].get("per_position")}


def result_of_run(runs_dir: Path, run: str, name: str) -> dict[str, Any]:
    """A baseline row read from the run itself: its own training (``status/train.json``, the train stage's seconds
    from ``demo.json``) and its own eval report. Used when the run's recipe is the baseline, so that the same
    training is not repeated; the eval must have read the same sets, limit and token budget as the variants.

    Raises:
        SystemExit: the run has not finished training or evaluation.
    """
    root = runs_dir / run
    snap_file = root / "status" / "train.json"
    vl = vllm_figures(root / "eval")
    if not snap_file.is_file() or vl is None:
        raise SystemExit(f"run {run} has no finished training and eval to take the baseline from; drop "
                         "--baseline-from-run or finish the run (make demo)")
    demo = root / "demo.json"
    stages = json.loads(demo.read_text()).get("stages", {}) if demo.is_file() else {}
    return {"name": name, "train": {}, "train_s": stages.get("train", {}).get("seconds", float("nan")),
            **training_figures(snap_file), "vllm": vl, "from_run": run}


def table(results: list[dict[str, Any]]) -> str:
    """Markdown table, one row per variant, deltas against the first (baseline)."""
    base = results[0]
    lines = ["| variant | train s | steps | held-out sim. accept len | held-out acc per step | vLLM accept len "
             "(overall) | vs baseline | MT-bench / GSM8K / HumanEval / Alpaca |",
             "| --- | ---: | ---: | ---: | --- | ---: | ---: | --- |"]
    for r in results:
        h = r.get("heldout") or {}
        acc = " / ".join(f"{x:.3f}" for x in h.get("acc", []))
        vl = (r.get("vllm") or {}).get("overall")
        bl = (base.get("vllm") or {}).get("overall")
        sets = (r.get("vllm") or {}).get("sets", {})
        per = " / ".join(f"{sets[k]:.2f}" for k in ("mt_bench", "gsm8k", "humaneval", "alpaca") if k in sets)
        delta = f"{vl - bl:+.3f}" if vl is not None and bl is not None else "-"
        lines.append(f"| {r['name']} | {r['train_s']:.0f} | {r.get('steps')} | {h.get('accept_len', 0):.3f} | {acc} "
                     f"| {'-' if vl is None else f'{vl:.3f}'} | {delta} | {per or '-'} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="Run whose data/ and features/ every variant trains on.")
    ap.add_argument("--runs-dir", default=str(REPO / "runs"))
    ap.add_argument("--variants", required=True, help="YAML list of {name, train: {...}}; the first is the baseline.")
    ap.add_argument("--base-config", default=None, help="YAML the variants start from (default: the run's "
                    "demo-config.yaml if it exists).")
    ap.add_argument("--epochs", type=int, default=None, help="Same number of passes for every variant.")
    ap.add_argument("--max-steps", type=int, default=None, help="Same optimizer-step budget for every variant.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--eval-limit", type=int, default=10, help="Questions per eval set in vLLM.")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--only", default=None, help="Comma-separated variant names to run now (others: kept results).")
    ap.add_argument("--redo", action="store_true", help="Run finished variants again.")
    ap.add_argument("--no-vllm", action="store_true", help="Skip the vLLM measurement (offline figures only).")
    ap.add_argument("--baseline-from-run", action="store_true", help="The first variant is the run's own recipe: "
                    "take its row from the run's training and eval (same seed, data and budget) instead of training "
                    "it again.")
    a = ap.parse_args()
    runs_dir = Path(a.runs_dir)
    base_file = Path(a.base_config) if a.base_config else runs_dir / a.run / "demo-config.yaml"
    base_cfg = yaml.safe_load(base_file.read_text()) if base_file.is_file() else {}
    variants = yaml.safe_load(Path(a.variants).read_text())
    only = set(a.only.split(",")) if a.only else None
    results = []
    for v in variants:
        done = runs_dir / f"{a.run}--{v['name']}" / "recipe-result.json"
        if a.baseline_from_run and v is variants[0]:
            r = result_of_run(runs_dir, a.run, v["name"])
            done.parent.mkdir(parents=True, exist_ok=True)
            done.write_text(json.dumps(r, indent=1))
            results.append(r)
            continue
        if done.is_file() and not a.redo and (only is None or v["name"] not in only):
            results.append(json.loads(done.read_text()))
            continue
        if only is not None and v["name"] not in only:
            continue
        print(f"== {v['name']}: {v.get('train', {})}", flush=True)
        r = run_variant(base_cfg, runs_dir, a.run, v, a)
        held = (r.get("heldout") or {}).get("accept_len")  # None when the run holds out no sample
        print(f"   held-out accept len {'-' if held is None else f'{held:.3f}'}, "
              f"vLLM {(r.get('vllm') or {}).get('overall')}, train {r['train_s']:.0f} s", flush=True)
        results.append(r)
    md = table(results)
    (runs_dir / a.run / "ablation.json").write_text(json.dumps(results, indent=1))
    (runs_dir / a.run / "ablation.md").write_text(md + "\n")
    print(md)
    vl = [(r.get("vllm") or {}).get("overall") for r in results]
    if vl and vl[0] and all(x is not None for x in vl):
        print(f"RATIO recipe {max(vl) / vl[0]:.3f}")


if __name__ == "__main__":
    main()
