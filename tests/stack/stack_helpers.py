"""Helpers of the stack tests: metric names in PromQL, metric names that exist, the dashboards and their queries."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "grafana" / "dashboards"
FIXTURES = REPO / "tests" / "fixtures" / "metrics"

_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset",
             "bool", "inf", "nan"}


def record_phase(name: str, seconds: float) -> None:
    """Add a setup phase of a test to CI's phase table (the file ``TEST_DRAFTSMITH_PHASES`` names; .ci/run)."""
    path = os.environ.get("TEST_DRAFTSMITH_PHASES")
    if path:
        with open(path, "a") as f:
            f.write(f"  {name:<26} {seconds:6.0f} s\n")


def promql_metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (functions, keywords, labels, strings and ranges left out).

    A small tokenizer, enough for the dashboards' expressions: removes strings, label matchers ``{...}``, ranges
    ``[...]`` and grouping clauses ``by (...)``; any remaining identifier not followed by ``(`` is a metric name.
    """
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*", e):
        if e[m.end():].lstrip().startswith("(") or m.group(0).lower() in _KEYWORDS:
            continue
        names.add(m.group(0))
    return names


def project_metric_names() -> set[str]:
    """Every sample name draftsmith's metrics module can expose (``_total``, ``_bucket``... included)."""
    import draftsmith.metrics as M
    from prometheus_client.metrics import MetricWrapperBase

    suffixes = {"counter": ["_total", "_created"], "histogram": ["_bucket", "_count", "_sum", "_created"],
                "gauge": [""], "summary": ["_count", "_sum", "_created"]}
    names = set()
    for obj in vars(M).values():
        if isinstance(obj, MetricWrapperBase):
            names.update(obj._name + s for s in suffixes[obj._type])
    return names


def recorded_metric_names(pattern: str = "*.txt") -> set[str]:
    """Sample names in the recorded vLLM and SGLang /metrics text (tests/fixtures/metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    names = set()
    for f in FIXTURES.glob(pattern):
        for fam in text_string_to_metric_families(f.read_text()):
            names.update(s.name for s in fam.samples)
    return names


def load_dashboards() -> dict[str, dict]:
    """The dashboard JSON files, by file stem."""
    return {f.stem: json.loads(f.read_text()) for f in sorted(DASHBOARDS.glob("*.json"))}


def dashboard_queries() -> list[tuple[str, str, str]]:
    """Every query of every dashboard: ``(dashboard, panel title, expr)``."""
    out = []
    for name, d in load_dashboards().items():
        for p in d["panels"]:
            out.extend((name, p["title"], t["expr"]) for t in p["targets"])
    return out


def concrete(expr: str, run_regex: str = ".*", rate_interval: str = "1m") -> str:
    """A dashboard expression with Grafana's variables replaced, ready for the Prometheus API."""
    return expr.replace("$__rate_interval", rate_interval).replace("$run", run_regex)
