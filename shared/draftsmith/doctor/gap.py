"""Check: the train/serve gap (docs/doctor.md, "gap").

The training log's simulated acceptance (``status/train.json``: per TTT step accuracy on held-out data, chained as a
greedy verifier would, ``drafter/ttt.py``) against the engine's per-position acceptance (``eval/report.json``). A
drafter that accepts far less in the engine than on its own held-out data is served otherwise than trained (the
other checks name how); a small gap with low acceptance points at the data instead.
"""

from __future__ import annotations

from draftsmith.artifacts.report import JSON_FILE as REPORT_FILE
from draftsmith.doctor.finding import CheckResult, Finding, skipped
from draftsmith.doctor.run import RunView

CHECK = "gap"
MIN_RATIO = 0.6  # served extra tokens per step / simulated ones; below: a mismatch, not noise
COST_SCALE = 0.3  # a symptom: ranked under the causes the other checks measure


def simulated_per_position(accs: list[float]) -> list[float]:
    """Chained per-position acceptance ``prod_{i<=j} acc_i`` of per-step accuracies."""
    out, prod = [], 1.0
    for a in accs:
        prod *= float(a)
        out.append(prod)
    return out


def check(run: RunView) -> CheckResult:
    """Engine per-position acceptance against the training's simulation."""
    st = run.train_status or {}
    split = st.get("heldout") or st.get("train")
    overall = (((run.report or {}).get("results") or [{}])[0].get("overall") or {})
    served = overall.get("per_position")
    if not split or not split.get("acc") or not served:
        return skipped(CHECK, f"needs status/train.json and eval/{REPORT_FILE}")
    sim = simulated_per_position(split["acc"])[: len(served)]
    sim_extra, served_extra = sum(sim), sum(float(x) for x in served[: len(sim)])
    if sim_extra <= 0.2 or served_extra >= MIN_RATIO * sim_extra:
        return CheckResult(CHECK, True)
    ratio = served_extra / sim_extra
    return CheckResult(CHECK, True, [Finding(
        CHECK, f"the engine accepts {ratio:.0%} of what training simulated: served otherwise than trained",
        COST_SCALE * (1 - ratio), "per position served " + "/".join(f"{x:.2f}" for x in served[: len(sim)])
        + ", simulated (held-out) " + "/".join(f"{x:.2f}" for x in sim),
        "look at the export, template and temperature findings; run doctor with --url for the live template check")])
