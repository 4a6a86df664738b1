"""Check: served traffic against the training prompts (docs/doctor.md, "traffic").

Per eval set of the report: its acceptance rate, and how near its prompts lie to the training prompts (each eval
prompt's cosine similarity to its nearest training prompt, TF-IDF over lower-cased words, averaged over the set).
Similarities are compared between the sets (words shared by chance keep every one above zero): a set that accepts
far less than the others and whose prompts lie clearly farther from the training prompts than the nearest set's is
traffic the drafter was not trained for (more data of that kind is the fix); a set that accepts little although its
prompts are as near as the others is not, and is left to the other checks.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter

from draftsmith.doctor.finding import CheckResult, Finding, skipped
from draftsmith.doctor.run import RunView
from draftsmith.errors import DataError
from draftsmith.evaluation.sets import load_set

CHECK = "traffic"
LOW_ACCEPTANCE = 0.6  # a set below this share of the sets' median acceptance rate
FAR = 0.75  # a set whose mean nearest-prompt similarity is below this share of the nearest set's is unlike the data
COST_SCALE = 0.5  # estimated: more data of the kind recovers about half the shortfall


def _words(text: str) -> Counter:
    return Counter(re.findall(r"[a-z]+", text.lower()))


def nearest_similarity(queries: list[str], corpus: list[str]) -> list[float]:
    """Cosine similarity (TF-IDF over words, idf from ``corpus``) of each query to its nearest corpus text."""
    docs = [_words(t) for t in corpus]
    df = Counter(w for d in docs for w in d)
    idf = {w: math.log((1 + len(docs)) / (1 + n)) + 1 for w, n in df.items()}

    def vec(c: Counter) -> dict[str, float]:
        v = {w: n * idf.get(w, math.log(1 + len(docs)) + 1) for w, n in c.items()}
        norm = math.sqrt(sum(x * x for x in v.values())) or 1.0
        return {w: x / norm for w, x in v.items()}

    vecs = [vec(d) for d in docs]
    out = []
    for q in queries:
        qv = vec(_words(q))
        out.append(max((sum(x * d.get(w, 0.0) for w, x in qv.items()) for d in vecs), default=0.0))
    return out


def check(run: RunView) -> CheckResult:
    """Per-set acceptance against the nearness of the set's prompts to the training prompts."""
    rep = run.report or {}
    sets = ((rep.get("results") or [{}])[0].get("sets")) or {}
    train = [next((m["content"] for m in r.get("messages") or [] if m.get("role") == "user"), "")
             for r in run.records.values()]
    if len(sets) < 2 or not train:
        return skipped(CHECK, "needs records/ and an eval report with two sets or more")
    ev = rep.get("config", {}).get("eval") or {}
    near: dict[str, float] = {}
    for name in sets:
        try:
            prompts = load_set(name, ev.get("limit"), ev.get("sets_dir")).prompts
        except DataError:
            continue  # a set file that moved since the eval: its traffic cannot be compared
        near[name] = statistics.mean(nearest_similarity([p.turns[0] for p in prompts], train))
    median = statistics.median(float(s["acceptance_rate"]) for s in sets.values())
    total = sum(float(s.get("draft_tokens") or 0) for s in sets.values()) or 1.0
    findings = []
    for name, s in sets.items():
        acc = float(s["acceptance_rate"])
        if name not in near or acc >= LOW_ACCEPTANCE * median or near[name] >= FAR * max(near.values()):
            continue
        share = float(s.get("draft_tokens") or 0) / total
        findings.append(Finding(
            CHECK, f"eval set {name!r} accepts {acc:.1%} (median of the sets {median:.1%}) and its prompts are unlike "
            f"the training prompts", COST_SCALE * share * (1 - acc / median),
            f"mean nearest-prompt similarity {near[name]:.2f} (others: " + ", ".join(
                f"{k} {v:.2f}" for k, v in near.items() if k != name) + f"); {share:.0%} of the eval's draft tokens",
            f"add prompts like {name!r}'s to the training data (`draftsmith enqueue --source ...`) and retrain"))
    return CheckResult(CHECK, True, findings)
