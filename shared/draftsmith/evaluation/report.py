"""Evaluation reports: ``report.json`` (machine), ``report.md`` (a person), ``report.png`` (engines side by side),
and the Grafana gauges (``metrics.prom`` textfile, in-process gauges, optional Pushgateway).

One definition for every number (``docs/evaluation.md``): acceptance rate = accepted draft tokens / proposed draft
tokens; mean acceptance length = tokens emitted per verify step, bonus token counted (1..K+1); per-position
acceptance = verify steps that accepted the draft token at position i / verify steps.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from draftsmith.artifacts.provenance import stamp
from draftsmith.artifacts.report import REPORT_SCHEMA, report_paths
from draftsmith.artifacts.storage import atomic_write_bytes, atomic_write_text
from draftsmith.evaluation.runner import SetMeasure
from draftsmith.log import get_logger

log = get_logger(__name__)

DEFINITION = {
    "acceptance_rate": "accepted draft tokens / proposed draft tokens (0..1)",
    "mean_acceptance_length": "tokens emitted per verify step, bonus token counted (1..K+1); "
    "vLLM: 1 + accepted/drafts; SGLang: completion_tokens/spec_verify_ct",
    "per_position": "verify steps that accepted the draft token at position i / verify steps",
    "output_tokens_per_s": "completion tokens of the set / wall time of the set, at the given concurrency",
    "speedup": "output_tokens_per_s with the drafter / baseline_output_tokens_per_s without it",
    "draft_vocab_coverage": "generated target tokens inside the drafter's draft vocabulary / generated tokens "
    "(0..1; a token outside it can never be drafted); vLLM only (from return_token_ids)",
}


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(float(x), nd)


def set_entry(m: SetMeasure, baseline: SetMeasure | None) -> dict[str, Any]:
    """The report fields of one set (or of ``overall``) on one engine."""
    a = m.acceptance
    tps = m.output_tokens_per_s
    btps = baseline.output_tokens_per_s if baseline else None
    return {
        "acceptance_rate": _r(a.acceptance_rate) if a else None,
        "mean_acceptance_length": _r(a.mean_acceptance_length) if a else None,
        "per_position": [_r(p) for p in a.per_position] if a else [],
        "output_tokens_per_s": _r(tps, 2),
        "baseline_output_tokens_per_s": _r(btps, 2),
        "speedup": _r(tps / btps, 3) if tps and btps else None,
        "requests": m.requests,
        "turns": m.turns,
        "output_tokens": m.output_tokens,
        "wall_s": _r(m.wall_s, 2),
        "drafts": a.drafts if a else None,
        "draft_tokens": a.draft_tokens if a else None,
        "accepted_tokens": a.accepted if a else None,
        "engine_reported_accept_length": _r(m.engine_figure),
        "draft_vocab_coverage": _r(m.draft_vocab_coverage),
    }


def engine_result(engine: str, k: int, temperature: float, sets: list[SetMeasure], total: SetMeasure,
                  baseline_sets: list[SetMeasure] | None, baseline_total: SetMeasure | None) -> dict[str, Any]:
    """One engine's block of the report: ``engine``, ``k``, ``temperature``, ``sets`` and ``overall``."""
    base = {b.name: b for b in baseline_sets or []}
    return {
        "engine": engine,
        "k": k,
        "temperature": temperature,
        "sets": {m.name: set_entry(m, base.get(m.name)) for m in sets},
        "overall": set_entry(total, baseline_total),
    }


def build_report(run: str, engine: str, k: int, temperature: float, results: list[dict[str, Any]],
                 target: str, drafter: str, offline: dict[str, Any] | None = None,
                 config: dict[str, Any] | None = None, drafter_code_version: str | None = None,
                 family: str = "eagle3") -> dict[str, Any]:
    """The whole ``report.json`` document (schema ``draftsmith.eval-report/1``), stamped with the code version and
    the config's hash (:mod:`draftsmith.artifacts.provenance`); ``drafter_code_version`` is the one the drafter's
    export records (None: it records none); ``family`` the drafter family it was served as
    (:mod:`draftsmith.drafter.families`)."""
    return stamp({
        "schema": REPORT_SCHEMA,
        "run": run,
        "engine": engine,
        "k": k,
        "temperature": temperature,
        "target": target,
        "drafter": drafter,
        "family": family,
        "drafter_code_version": drafter_code_version,
        "definition": DEFINITION,
        "results": results,
        "offline": offline,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": config,
    })

# Below this overall acceptance rate the report sends the reader to `draftsmith doctor`: the seed's operator saw 15 %
# in vLLM on an MLA target and changed engines without knowing why; the small demo's trained drafter sits near 20 %.
DOCTOR_BELOW_RATE = 0.15


def doctor_pointers(report: dict[str, Any]) -> list[str]:
    """One line per engine whose overall acceptance rate is below :data:`DOCTOR_BELOW_RATE`, pointing at
    ``draftsmith doctor`` for this run and drafter (docs/doctor.md); [] when every engine is above it."""
    out = []
    for res in report.get("results") or []:
        rate = (res.get("overall") or {}).get("acceptance_rate")
        if rate is not None and rate < DOCTOR_BELOW_RATE:
            out.append(f"Acceptance rate {100 * rate:.1f}% in {res['engine']} is below {100 * DOCTOR_BELOW_RATE:.0f}%: "
                       f"`draftsmith doctor --run {report['run']} --drafter {report['drafter']}` names the likely "
                       "causes with their evidence and fixes (docs/doctor.md).")
    return out


def _fmt(x: Any, pct: bool = False) -> str:
    if x is None:
        return "-"
    return f"{100 * x:.1f}%" if pct else (f"{x:.2f}" if isinstance(x, float) else str(x))


# How each family proposes its K tokens per verify step, for the report's first line.
DRAFTING = {"eagle3": "chain", "peagle": "parallel, one drafter pass", "dflash": "block, one drafter pass"}


def drafter_provenance(report: dict[str, Any]) -> str:
    """The report's line on which build exported the drafter (its export's ``code_version``), or that it records
    none (a peer's export, or one written before exports recorded it)."""
    v = report.get("drafter_code_version")
    if v:
        return f"Drafter exported by {v}."
    return ("The drafter's export records no code_version (a peer's export, or an older draftsmith's): which build "
            "made it is unknown.")


def render_markdown(report: dict[str, Any]) -> str:
    """``report.md``: one table per engine (sets and overall), the definitions, and the offline estimate."""
    lines = [f"# Acceptance of the drafter: run `{report['run']}`", "",
             f"Target `{report['target']}`, {report.get('family', 'eagle3')} drafter `{report['drafter']}`, "
             f"K = {report['k']} speculative tokens ({DRAFTING.get(report.get('family'), 'chain')}), "
             f"temperature {report['temperature']}."
             + (f" Made by {report['code_version']}." if report.get("code_version") else ""),
             "", drafter_provenance(report), ""]
    for line in doctor_pointers(report):
        lines += [line, ""]
    for res in report["results"]:
        lines += [f"## {res['engine']}", "",
                  "| set | acceptance rate | mean acceptance length | per position | output tok/s | baseline tok/s "
                  "| speedup | engine's own figure | draft vocab coverage |",
                  "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
        for name, e in [*res["sets"].items(), ("**overall**", res["overall"])]:
            pos = ", ".join(_fmt(p, pct=True) for p in e["per_position"]) or "-"
            lines.append(
                f"| {name} | {_fmt(e['acceptance_rate'], pct=True)} | {_fmt(e['mean_acceptance_length'])} | {pos} | "
                f"{_fmt(e['output_tokens_per_s'])} | {_fmt(e['baseline_output_tokens_per_s'])} | "
                f"{_fmt(e['speedup'])} | {_fmt(e['engine_reported_accept_length'])} | "
                f"{_fmt(e.get('draft_vocab_coverage'), pct=True)} |")
        lines.append("")
    if report.get("offline"):
        o = report["offline"]
        lines += ["## Offline estimate (transformers, greedy chain, no engine)", "",
                  f"acceptance rate {_fmt(o.get('acceptance_rate'), pct=True)}, mean acceptance length "
                  f"{_fmt(o.get('mean_acceptance_length'))}", ""]
    lines += ["## Definitions (one for every engine)", ""]
    lines += [f"- **{k}**: {v}" for k, v in report["definition"].items()]
    lines += ["", "The ceiling of the mean acceptance length under chain drafting is K + 1. "
              "\"engine's own figure\" is vLLM's 1 + accepted/drafts or SGLang's `sglang:spec_accept_length` gauge "
              "(recent batches only), shown as a cross-check.", ""]
    return "\n".join(lines)


def render_png(report: dict[str, Any], path: Path) -> None:
    """``report.png``: acceptance per draft position (overall) and mean acceptance length per set, engines side by
    side (grouped bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    k = int(report["k"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.8 / max(1, len(results))
    for j, res in enumerate(results):
        pos = [p or 0.0 for p in res["overall"]["per_position"]] + [0.0] * k
        xs = [i + j * width for i in range(k)]
        ax1.bar(xs, pos[:k], width, label=res["engine"])
        names = list(res["sets"])
        lens = [res["sets"][n]["mean_acceptance_length"] or 0.0 for n in names]
        ax2.bar([i + j * width for i in range(len(names))], lens, width, label=res["engine"])
        ax2.set_xticks([i + width * (len(results) - 1) / 2 for i in range(len(names))], names)
    ax1.set_xticks([i + width * (len(results) - 1) / 2 for i in range(k)], [str(i + 1) for i in range(k)])
    ax1.set(xlabel="draft position", ylabel="acceptance (per verify step)", ylim=(0, 1),
            title="Acceptance per draft position (overall)")
    ax2.axhline(k + 1, color="grey", linestyle="--", linewidth=1, label=f"ceiling K+1 = {k + 1}")
    ax2.set(ylabel="mean acceptance length (bonus counted)", ylim=(0, k + 1.5), title="Mean acceptance length per set")
    ax1.legend()
    ax2.legend()
    fig.suptitle(f"run {report['run']}: K={k}, T={report['temperature']}")
    fig.tight_layout()
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def publish(report: dict[str, Any], prom_path: Path, pushgateway_url: str | None = None) -> None:
    """Set the eval gauges (per set and engine), write them as a textfile, push them if a gateway is configured."""
    from prometheus_client import generate_latest, push_to_gateway

    from draftsmith import metrics as M

    run = report["run"]
    for res in report["results"]:
        for name, e in [*res["sets"].items(), ("overall", res["overall"])]:
            labels = (run, res["engine"], name)
            for gauge, key in ((M.EVAL_ACCEPTANCE_RATE, "acceptance_rate"),
                               (M.EVAL_ACCEPTANCE_LENGTH, "mean_acceptance_length"),
                               (M.EVAL_OUTPUT_TPS, "output_tokens_per_s"), (M.EVAL_SPEEDUP, "speedup")):
                if e.get(key) is not None:
                    gauge.labels(*labels).set(e[key])
            for i, p in enumerate(e["per_position"]):
                if p is not None:
                    M.EVAL_ACCEPTANCE_POSITION.labels(*labels, str(i)).set(p)
    atomic_write_bytes(prom_path, generate_latest(M.EVAL_REGISTRY))
    if pushgateway_url:
        push_to_gateway(pushgateway_url, job="draftsmith-eval", registry=M.EVAL_REGISTRY, grouping_key={"run": run})
        log.info("pushed eval gauges to %s", pushgateway_url)


def write_reports(report: dict[str, Any], out_dir: Path, pushgateway_url: str | None = None) -> dict[str, Path]:
    """Write ``report.json``, ``report.md``, ``report.png`` and ``metrics.prom`` into ``out_dir``; set the gauges.

    Returns:
        ``{"json": ..., "md": ..., "png": ..., "prom": ...}`` paths.
    """
    out_dir = Path(out_dir)
    paths = report_paths(out_dir)
    atomic_write_text(paths["json"], json.dumps(report, indent=2, default=str) + "\n")
    atomic_write_text(paths["md"], render_markdown(report))
    render_png(report, paths["png"])
    publish(report, paths["prom"], pushgateway_url)
    log.info("eval reports written to %s", out_dir)
    return paths
