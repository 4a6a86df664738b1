"""Checks: the served context and sampling temperature against the data (docs/doctor.md, "context", "temperature").

Context: the share of the target's answer tokens (``records/``, positions as served: prompt length + offset) that lie
at positions past the longest training sample; the drafter never trained there (a ``data.max_length`` cut short).
The served limit (the live server's ``max_model_len``, else ``target.max_model_len``) is given as evidence.
Temperature: the generation temperature in the records' ``sampling`` against the temperature the drafter was
evaluated or served at (the eval report's).
"""

from __future__ import annotations

import statistics

from draftsmith.artifacts.report import JSON_FILE as REPORT_FILE
from draftsmith.doctor.finding import CheckResult, Finding, skipped
from draftsmith.doctor.run import RunView

CONTEXT, TEMPERATURE = "context", "temperature"
MAX_UNTRAINED = 0.05  # share of served answer tokens at untrained positions
CONTEXT_COST_SCALE = 0.5  # attention at unseen positions degrades, it does not vanish: half the share, estimated
MAX_TEMPERATURE_GAP = 0.3
TEMPERATURE_COST = 0.3  # sampled verification accepts fewer greedy-trained drafts (SpecForge #128), estimated


def served_limit(run: RunView, url: str | None) -> int | None:
    """The served context: the live server's ``max_model_len`` (``/v1/models``), else the settings'."""
    if url:
        import httpx

        try:
            data = httpx.get(url.rstrip("/").removesuffix("/v1") + "/v1/models", timeout=10).json()["data"][0]
            return int(data["max_model_len"])
        except (httpx.HTTPError, KeyError, IndexError, ValueError):
            pass  # the template check reports an unreachable server
    n = (run.settings.get("target") or {}).get("max_model_len")
    return int(n) if n else None


def context(run: RunView, url: str | None = None) -> CheckResult:
    """Share of answer tokens past the longest training sample."""
    longest = max(run.data_lengths, default=0)
    if not longest or not run.records:
        return skipped(CONTEXT, "needs data/ and records/")
    total = past = 0
    for r in run.records.values():
        for t in r.get("turns") or []:
            p, g = t.get("prompt_token_ids"), t.get("token_ids")
            start = len(p) if p else int((t.get("usage") or {}).get("prompt_tokens") or 0)
            n = len(g) if g is not None else int((t.get("usage") or {}).get("completion_tokens") or 0)
            total += n
            past += max(0, start + n - max(start, longest))
    if not total:
        return skipped(CONTEXT, "the records hold no answer tokens")
    share = past / total
    if share <= MAX_UNTRAINED:
        return CheckResult(CONTEXT, True)
    limit = served_limit(run, url)
    cut = ((run.settings.get("data") or {}).get("max_length"))
    return CheckResult(CONTEXT, True, [Finding(
        CONTEXT, f"{share:.0%} of the target's answer tokens sit past the longest training sample ({longest} tokens)",
        CONTEXT_COST_SCALE * share, f"{past} of {total} answer tokens at positions >= {longest}; data.max_length "
        f"{cut}; served context {limit}", "raise data.max_length (and data.too_long) to cover the served answers, "
        "rebuild, re-extract and retrain")])


def temperature(run: RunView) -> CheckResult:
    """Generation temperature of the data against the evaluated one."""
    temps = [float(r["sampling"]["temperature"]) for r in run.records.values()
             if (r.get("sampling") or {}).get("temperature") is not None]
    data_t = statistics.median(temps) if temps else (run.settings.get("generation") or {}).get("temperature")
    served_t = (run.report or {}).get("temperature")
    if data_t is None or served_t is None:
        return skipped(TEMPERATURE, f"needs records/ (or the run's settings) and eval/{REPORT_FILE}")
    gap = abs(float(served_t) - float(data_t))
    if gap < MAX_TEMPERATURE_GAP:
        return CheckResult(TEMPERATURE, True)
    return CheckResult(TEMPERATURE, True, [Finding(
        TEMPERATURE, f"served at temperature {float(served_t):g}, the data was generated at {float(data_t):g}",
        min(0.5, TEMPERATURE_COST * gap), f"records' sampling.temperature median {float(data_t):g} over "
        f"{len(temps)} records; eval/{REPORT_FILE} temperature {float(served_t):g}",
        "regenerate the data at the serving temperature (generation.temperature), or serve nearer the data's")])
