"""Check: draft vocabulary coverage (docs/doctor.md, "coverage").

A target token outside the draft vocabulary can never be drafted, so each such answer token is a rejected draft.
Measured on the target's answers in ``records/`` with the draft vocabulary the engine serves (the export's ``d2t``,
else the data's), and taken from the eval report (``draft_vocab_coverage`` of the evaluated answers) when present.
"""

from __future__ import annotations

import torch

from draftsmith.artifacts.report import JSON_FILE as REPORT_FILE
from draftsmith.doctor.finding import CheckResult, Finding, skipped
from draftsmith.doctor.run import RunView
from draftsmith.errors import ModelError

CHECK = "coverage"
MIN_COVERAGE = 0.85  # the default 8192-token vocabulary covers ~0.9 of SmolLM2's demo answers (docs/benchmarks.md)


def served_vocab(run: RunView) -> torch.Tensor | None:
    """Bool ``[V]``: target tokens the drafter can propose as served (export's d2t, else the data's), or None."""
    from draftsmith.drafter.load import vocab_maps
    V = int((run.target_config or {}).get("vocab_size") or 0)
    if run.exports and V:
        _, _, config, weights = run.exports[0]
        try:
            return vocab_maps(config, weights, V)[1]
        except ModelError:
            pass  # the export check reports inconsistent maps
    return run.draft_vocab[1] if run.draft_vocab is not None else None


def check(run: RunView) -> CheckResult:
    """Coverage of the records' answers and of the evaluated answers."""
    t2d = served_vocab(run)
    measured: dict[str, float] = {}
    if t2d is not None and run.records:
        ids = torch.tensor([i for r in run.records.values() for t in r.get("turns") or []
                            for i in (t.get("token_ids") or [])], dtype=torch.long)
        if ids.numel():
            measured["the target's answers in records/"] = float(t2d[ids].float().mean())
    overall = (((run.report or {}).get("results") or [{}])[0].get("overall") or {}).get("draft_vocab_coverage")
    if overall is not None:
        measured[f"the evaluated answers (eval/{REPORT_FILE})"] = float(overall)
    if not measured:
        return skipped(CHECK, "needs a draft vocabulary and records/ or an eval report")
    where, worst = min(measured.items(), key=lambda kv: kv[1])
    if worst >= MIN_COVERAGE:
        return CheckResult(CHECK, True)
    n = int(t2d.sum()) if t2d is not None else "?"
    return CheckResult(CHECK, True, [Finding(
        CHECK, f"the draft vocabulary covers {worst:.1%} of {where}", 1 - worst,
        "; ".join(f"{k}: {v:.1%}" for k, v in measured.items()) + f"; {n} draft tokens",
        "build the draft vocabulary from the target's own answers (`draftsmith build-data`), or a larger "
        "data.draft_vocab_size")])
