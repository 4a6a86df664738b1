"""Grafana dashboards and provisioning, Prometheus config: structure, paths, and metric names that exist.

Grafana cannot be installed here, so the dashboard JSON and the provisioning files are checked for what Grafana
reads; the queries are checked against the metric names of draftsmith's metrics module and of recorded vLLM and
SGLang /metrics text, and (tests/stack/test_live_prometheus.py) against a real Prometheus.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import yaml
from stack_helpers import (
    DASHBOARDS,
    REPO,
    dashboard_queries,
    load_dashboards,
    project_metric_names,
    promql_metric_names,
    recorded_metric_names,
)

# What each dashboard must show, as words that must appear in its panel titles.
REQUIRED_PANELS = {
    "generation": ["Progress", "ETA", "Completed requests", "Output tokens", "in flight", "p50 / p95",
                   "Errors by reason", "Queue depth", "Workers alive"],
    "extraction": ["Samples / s", "Tokens / s", "Bytes written", "Free disk", "Shards done"],
    "training": ["Loss per TTT step", "accuracy per TTT step", "Simulated acceptance length", "Learning rate",
                 "Tokens / s"],
    "serving": ["vLLM acceptance rate", "SGLang acceptance rate", "vLLM mean acceptance length",
                "SGLang mean acceptance length", "acceptance per position", "Running and waiting", "KV-cache",
                "Evaluator"],
}


def _builder():
    spec = importlib.util.spec_from_file_location("build_dashboards", REPO / "grafana" / "build_dashboards.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_promql_name_extraction():
    expr = ('histogram_quantile(0.95, sum by (le, run) (rate(draftsmith_generation_request_latency_seconds_bucket'
            '{run=~"$run",outcome="ok"}[$__rate_interval]))) / scalar(sum(rate(vllm:spec_decode_num_drafts_total'
            '[5m]))) > 1e-9 and on() 1 + avg(sglang:spec_accept_length) offset 5m')
    assert promql_metric_names(expr) == {"draftsmith_generation_request_latency_seconds_bucket",
                                         "vllm:spec_decode_num_drafts_total", "sglang:spec_accept_length"}


def test_dashboard_json_matches_builder():
    b = _builder()
    assert sorted(d.uid for d in b.DASHBOARDS) == ["extraction", "generation", "serving", "training"]
    for d in b.DASHBOARDS:
        assert (DASHBOARDS / f"{d.uid}.json").read_text() == b.render(d), \
            f"{d.uid}.json is stale: run .venv/bin/python grafana/build_dashboards.py"


def test_dashboard_structure():
    dashboards = load_dashboards()
    assert set(dashboards) == set(REQUIRED_PANELS)
    uids = set()
    for name, d in dashboards.items():
        assert d["uid"] == f"draftsmith-{name}" and d["title"] and d["schemaVersion"] >= 36
        uids.add(d["uid"])
        ids = [p["id"] for p in d["panels"]]
        assert len(ids) == len(set(ids))
        for p in d["panels"]:
            g = p["gridPos"]
            assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, (name, p["title"])
            assert p["type"] in {"timeseries", "stat"} and p["datasource"]["uid"] == "prometheus"
            assert p["targets"], (name, p["title"])
            refs = [t["refId"] for t in p["targets"]]
            assert len(refs) == len(set(refs)) and all(t["expr"].strip() for t in p["targets"])
        titles = " | ".join(p["title"] for p in d["panels"])
        for words in REQUIRED_PANELS[name]:
            assert words.lower() in titles.lower(), f"{name}: no panel for {words!r}"
        for var in d["templating"]["list"]:
            assert var["datasource"]["uid"] == "prometheus"
            (metric,) = promql_metric_names(var["definition"].replace("label_values(", "(").split(",")[0] + ")")
            assert metric in project_metric_names(), (name, metric)
    assert len(uids) == 4


def test_every_query_names_existing_metrics():
    known = project_metric_names() | recorded_metric_names()
    assert {"draftsmith_generation_requests_total", "vllm:spec_decode_num_drafts_total", "sglang:num_queue_reqs",
            "sglang:spec_accept_length", "vllm:kv_cache_usage_perc"} <= known
    queries = dashboard_queries()
    assert len(queries) >= 50
    for dash, title, expr in queries:
        names = promql_metric_names(expr)
        assert names, (dash, title, expr)
        assert names <= known, f"{dash} / {title}: unknown metrics {names - known}"


def test_every_project_metric_is_on_a_dashboard_or_documented():
    """docs/metrics.md lists every metric of the module; most are on a dashboard."""
    doc = (REPO / "docs" / "metrics.md").read_text()
    used = set().union(*(promql_metric_names(e) for _, _, e in dashboard_queries()))
    import draftsmith.metrics as M
    from prometheus_client.metrics import MetricWrapperBase

    families = {o._name: o._type for o in vars(M).values() if isinstance(o, MetricWrapperBase)}
    for name, kind in families.items():
        shown = name + {"counter": "_total", "histogram": "_bucket"}.get(kind, "")
        assert f"`{shown}`" in doc, f"docs/metrics.md misses {shown}"
    on_dash = {n for n in families if any(u.startswith(n) for u in used)}
    assert len(on_dash) >= len(families) - 2, f"not on any dashboard: {set(families) - on_dash}"


def test_grafana_provisioning_matches_compose():
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())
    graf = compose["services"]["grafana"]
    mounts = {v.split(":")[0]: v.split(":")[1] for v in graf["volumes"]}
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    ds = yaml.safe_load((REPO / "grafana/provisioning/datasources/prometheus.yml").read_text())
    (source,) = ds["datasources"]
    assert source["uid"] == "prometheus" and source["type"] == "prometheus"
    prom_port = compose["services"]["prometheus"]["ports"][0].rsplit(":", 1)[1]
    assert source["url"] == f"http://prometheus:{prom_port}"
    prov = yaml.safe_load((REPO / "grafana/provisioning/dashboards/draftsmith.yml").read_text())
    (provider,) = prov["providers"]
    assert provider["type"] == "file" and mounts["./grafana/dashboards"] == provider["options"]["path"]
    home = graf["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(provider["options"]["path"] + "/")
    assert (DASHBOARDS / home.rsplit("/", 1)[1]).is_file()


def test_prometheus_config_is_valid_and_scrapes_every_service():
    cfg_path = REPO / "prometheus" / "prometheus.yml"
    out = subprocess.run(["promtool", "check", "config", str(cfg_path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    cfg = yaml.safe_load(cfg_path.read_text())
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())["services"]
    for svc in ("generator", "extractor", "trainer", "queue-exporter"):
        assert svc in jobs, f"Prometheus does not scrape {svc}"
        j = jobs[svc]
        port = (j["dns_sd_configs"][0]["port"] if "dns_sd_configs" in j
                else int(j["static_configs"][0]["targets"][0].rsplit(":", 1)[1]))
        assert port == 9400 and svc in compose
    # the evaluator ends; its gauges come from the Pushgateway, with the labels it pushed
    assert jobs["evaluator"]["static_configs"][0]["targets"] == ["pushgateway:9091"]
    assert jobs["evaluator"]["honor_labels"] is True and "pushgateway" in compose
    # scaled generator replicas are each found (DNS A records), not one load-balanced address
    assert jobs["generator"]["dns_sd_configs"][0] == {"names": ["generator"], "type": "A", "port": 9400,
                                                      "refresh_interval": "15s"}
    assert jobs["target"]["static_configs"][0]["targets"] == ["target:8000"]


@pytest.mark.parametrize("fixture", ["vllm.txt", "vllm-spec.txt", "sglang.txt", "sglang-spec.txt"])
def test_recorded_metrics_parse(fixture):
    names = recorded_metric_names(fixture)
    prefix = fixture.split("-")[0].split(".")[0] + ":"
    assert len([n for n in names if n.startswith(prefix)]) >= 2
