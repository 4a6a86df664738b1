"""Write the four Grafana dashboards of the stack as JSON (``grafana/dashboards/*.json``) from one short spec.

Run ``.venv/bin/python grafana/build_dashboards.py`` after changing a panel; ``tests/stack`` checks that the JSON
files equal what this script writes, that every PromQL expression names only metrics that exist
(``shared/draftsmith/metrics.py`` or recorded vLLM / SGLang ``/metrics`` text), and that the queries return data
from a live Prometheus. Metric names and units: ``docs/metrics.md``.

Grafana variables used in expressions: ``$run`` (draftsmith run label), ``$__rate_interval`` (Grafana's own).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "prometheus"}  # provisioning/datasources/prometheus.yml
RI = "$__rate_interval"
RUN = 'run=~"$run"'


@dataclass
class Panel:
    """One panel: a title, PromQL expressions with their legends, a Grafana unit and a panel type."""

    title: str
    exprs: list[tuple[str, str]]
    unit: str = "short"
    kind: str = "timeseries"  # timeseries | stat
    description: str = ""
    width: int = 12


@dataclass
class Dashboard:
    """A dashboard file: uid (also the file name), title, panels, and the metric its `run` variable lists."""

    uid: str
    title: str
    description: str
    panels: list[Panel] = field(default_factory=list)
    run_metric: str | None = None


GENERATION = Dashboard(
    "generation", "draftsmith / generation",
    "Regeneration of answers by the target through the rq worker pool.",
    run_metric="draftsmith_generation_prompts_total",
    panels=[
        Panel("Progress (prompts done / total)", [(
            f"max by (run) (draftsmith_generation_prompts_done{{{RUN}}}) / "
            f"max by (run) (draftsmith_generation_prompts_total{{{RUN}}})", "{{run}}")],
            unit="percentunit", kind="stat", width=6),
        Panel("ETA", [(
            f"(max by (run) (draftsmith_generation_prompts_total{{{RUN}}}) - "
            f"max by (run) (draftsmith_generation_prompts_done{{{RUN}}})) / "
            f"(max by (run) (deriv(draftsmith_generation_prompts_done{{{RUN}}}[10m])) > 0)", "{{run}}")],
            unit="s", kind="stat", width=6,
            description="Prompts left / prompts finished per second over the last 10 minutes."),
        Panel("Prompts done and total", [
            (f"max by (run) (draftsmith_generation_prompts_done{{{RUN}}})", "done {{run}}"),
            (f"max by (run) (draftsmith_generation_prompts_total{{{RUN}}})", "total {{run}}")], width=12),
        Panel("Completed requests / s", [(
            f'sum by (run) (rate(draftsmith_generation_requests_total{{{RUN},outcome="ok"}}[{RI}]))', "{{run}}")],
            unit="reqps", description="Successful chat requests (one per assistant turn) per second."),
        Panel("Output tokens / s", [(
            f"sum by (run) (rate(draftsmith_generation_completion_tokens_total{{{RUN}}}[{RI}]))", "{{run}}")],
            unit="short", description="Completion tokens reported by the target (usage), per second."),
        Panel("Requests in flight", [(f"sum by (run) (draftsmith_generation_inflight{{{RUN}}})", "{{run}}")]),
        Panel("Request latency p50 / p95", [
            (f"histogram_quantile(0.5, sum by (le, run) "
             f"(rate(draftsmith_generation_request_latency_seconds_bucket{{{RUN}}}[{RI}])))", "p50 {{run}}"),
            (f"histogram_quantile(0.95, sum by (le, run) "
             f"(rate(draftsmith_generation_request_latency_seconds_bucket{{{RUN}}}[{RI}])))", "p95 {{run}}")],
            unit="s"),
        Panel("Errors by reason (/ s)", [(
            f"sum by (reason) (rate(draftsmith_generation_errors_total{{{RUN}}}[{RI}]))", "{{reason}}")],
            unit="reqps", description="Retried (timeout, connection, http_5xx, http_429) and permanent ones."),
        Panel("Requests by outcome (total)", [(
            f"sum by (outcome) (draftsmith_generation_requests_total{{{RUN}}})", "{{outcome}}")]),
        Panel("Queue depth", [
            ("max by (queue) (draftsmith_queue_depth)", "waiting {{queue}}"),
            ("max by (queue) (draftsmith_queue_started_jobs)", "running {{queue}}"),
            ("max by (queue) (draftsmith_queue_failed_jobs)", "failed {{queue}}")]),
        Panel("Workers alive", [("max by (queue) (draftsmith_workers_alive)", "{{queue}}")]),
        Panel("Target engine: running / waiting requests", [
            ("sum(vllm:num_requests_running)", "vLLM running"), ("sum(vllm:num_requests_waiting)", "vLLM waiting"),
            ("sum(sglang:num_running_reqs)", "SGLang running"), ("sum(sglang:num_queue_reqs)", "SGLang waiting")]),
    ],
)

EXTRACTION = Dashboard(
    "extraction", "draftsmith / extraction",
    "Hidden-state extraction: the target's aux and final hidden states written as feature shards.",
    run_metric="draftsmith_extract_shards_total",
    panels=[
        Panel("Shards done / total", [(
            f"max by (run) (draftsmith_extract_shards_done{{{RUN}}}) / "
            f"max by (run) (draftsmith_extract_shards_total{{{RUN}}})", "{{run}}")],
            unit="percentunit", kind="stat", width=6),
        Panel("Free disk (features folder)", [(
            f"min by (run) (draftsmith_extract_free_disk_bytes{{{RUN}}})", "{{run}}")],
            unit="bytes", kind="stat", width=6),
        Panel("Shards done and total", [
            (f"max by (run) (draftsmith_extract_shards_done{{{RUN}}})", "done {{run}}"),
            (f"max by (run) (draftsmith_extract_shards_total{{{RUN}}})", "total {{run}}")]),
        Panel("Samples / s", [(
            f"sum by (run) (rate(draftsmith_extract_samples_total{{{RUN}}}[{RI}]))", "{{run}}")]),
        Panel("Tokens / s", [
            (f"sum by (run) (rate(draftsmith_extract_tokens_total{{{RUN}}}[{RI}]))", "{{run}} (all workers)"),
            (f"sum by (run) (draftsmith_extract_tokens_per_second{{{RUN}}})", "{{run}} (last shards)")]),
        Panel("Bytes written / s", [(
            f"sum by (run) (rate(draftsmith_extract_bytes_written_total{{{RUN}}}[{RI}]))", "{{run}}")],
            unit="Bps"),
        Panel("Bytes written (total)", [(
            f"sum by (run) (draftsmith_extract_bytes_written_total{{{RUN}}})", "{{run}}")], unit="bytes"),
        Panel("Skipped samples by reason", [(
            f"sum by (reason) (draftsmith_extract_skipped_samples_total{{{RUN}}})", "{{reason}}")]),
        Panel("Shard compute time p50 / p95", [
            (f"histogram_quantile(0.5, sum by (le) (rate(draftsmith_extract_shard_seconds_bucket{{{RUN}}}[{RI}])))",
             "p50"),
            (f"histogram_quantile(0.95, sum by (le) (rate(draftsmith_extract_shard_seconds_bucket{{{RUN}}}[{RI}])))",
             "p95")], unit="s"),
        Panel("Queue `extract`", [
            ('max(draftsmith_queue_depth{queue=~".*extract"})', "waiting"),
            ('max(draftsmith_workers_alive{queue=~".*extract"})', "workers")]),
        Panel("Target held by the extractor", [("sum by (backend) (draftsmith_extract_target_held)", "{{backend}}")],
              description="Extraction workers holding the target (its GPUs taken); 0 once the extract queue has been "
              "empty for extract.release_idle_s (EXTRACT_RELEASE_IDLE_S): make train and make up wait for it."),
    ],
)

SERVING = Dashboard(
    "serving", "draftsmith / serving & acceptance",
    "The target engine with the drafter: acceptance in vLLM and SGLang, load and KV cache, and the evaluator's "
    "reports. vLLM: rate = accepted / draft tokens, length = 1 + accepted / drafts (bonus token counted); "
    "SGLang gauges use the same definitions over recent steps.",
    run_metric="draftsmith_eval_acceptance_rate",
    panels=[
        Panel("vLLM acceptance rate", [(
            f"sum(rate(vllm:spec_decode_num_accepted_tokens_total[{RI}])) / "
            f"sum(rate(vllm:spec_decode_num_draft_tokens_total[{RI}]))", "vLLM")], unit="percentunit", width=6),
        Panel("vLLM mean acceptance length", [(
            f"1 + sum(rate(vllm:spec_decode_num_accepted_tokens_total[{RI}])) / "
            f"sum(rate(vllm:spec_decode_num_drafts_total[{RI}]))", "vLLM")], width=6),
        Panel("SGLang acceptance rate", [("avg(sglang:spec_accept_rate)", "SGLang")], unit="percentunit", width=6),
        Panel("SGLang mean acceptance length", [("avg(sglang:spec_accept_length)", "SGLang")], width=6),
        Panel("vLLM acceptance per position", [(
            f"sum by (position) (rate(vllm:spec_decode_num_accepted_tokens_per_pos_total[{RI}])) / "
            f"scalar(sum(rate(vllm:spec_decode_num_drafts_total[{RI}])))", "position {{position}}")],
            unit="percentunit"),
        Panel("Running and waiting requests", [
            ("sum(vllm:num_requests_running)", "vLLM running"), ("sum(vllm:num_requests_waiting)", "vLLM waiting"),
            ("sum(sglang:num_running_reqs)", "SGLang running"), ("sum(sglang:num_queue_reqs)", "SGLang waiting")]),
        Panel("KV-cache use", [
            ("max(vllm:kv_cache_usage_perc)", "vLLM"), ("max(sglang:token_usage)", "SGLang")], unit="percentunit"),
        Panel("Engine output tokens / s", [
            (f"sum(rate(vllm:generation_tokens_total[{RI}]))", "vLLM"),
            (f"sum(rate(sglang:generation_tokens_total[{RI}]))", "SGLang"), ("sum(sglang:gen_throughput)", "SGLang (gauge)")]),
        Panel("Engine time to first token p95", [
            (f"histogram_quantile(0.95, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[{RI}])))", "vLLM"),
            (f"histogram_quantile(0.95, sum by (le) (rate(sglang:time_to_first_token_seconds_bucket[{RI}])))",
             "SGLang")], unit="s"),
        Panel("Evaluator: acceptance rate per set", [(
            f"max by (engine, set) (draftsmith_eval_acceptance_rate{{{RUN}}})", "{{engine}} {{set}}")],
            unit="percentunit", description="From the last report of `draftsmith eval` (runs/<run>/eval/)."),
        Panel("Evaluator: mean acceptance length per set", [(
            f"max by (engine, set) (draftsmith_eval_mean_acceptance_length{{{RUN}}})", "{{engine}} {{set}}")]),
        Panel("Evaluator: acceptance per position", [(
            f'max by (engine, position) (draftsmith_eval_acceptance_per_position{{{RUN},set="overall"}})',
            "{{engine}} pos {{position}}")], unit="percentunit"),
        Panel("Evaluator: speedup and output tokens / s", [
            (f"max by (engine, set) (draftsmith_eval_speedup{{{RUN}}})", "speedup {{engine}} {{set}}"),
            (f"max by (engine, set) (draftsmith_eval_output_tokens_per_second{{{RUN}}})", "tok/s {{engine}} {{set}}")]),
        Panel("Gateway requests / s by upstream and status", [(
            f"sum by (upstream, status) (rate(draftsmith_gateway_requests_total{{{RUN}}}[{RI}]))",
            "{{upstream}} {{status}}")], unit="reqps", width=8,
            description="`draftsmith gateway`: stable, canary, or fallback (no routes stored); status `error`: the "
            "engine could not be reached or broke mid-answer."),
        Panel("Gateway: captured and masked / s", [
            (f"sum by (kind) (rate(draftsmith_gateway_captured_total{{{RUN}}}[{RI}]))", "captured {{kind}}"),
            (f"sum by (kind) (rate(draftsmith_gateway_masked_total{{{RUN}}}[{RI}]))", "masked {{kind}}")],
            width=8, description="Captured into the run's records (answered, or the prompt alone) and spans masked."),
        Panel("Gateway added latency p50 / p99", [
            (f"histogram_quantile(0.5, sum by (le) (rate(draftsmith_gateway_added_latency_seconds_bucket{{{RUN}}}[{RI}])))",
             "p50"),
            (f"histogram_quantile(0.99, sum by (le) (rate(draftsmith_gateway_added_latency_seconds_bucket{{{RUN}}}[{RI}])))",
             "p99")], unit="s", width=8),
        Panel("Canary: mean acceptance length per drafter version", [(
            f"max by (version) (draftsmith_canary_acceptance_length{{{RUN}}})", "{{version}}")], width=8,
            description="Each version's mean per-request acceptance length in the run's last canary trial, from its "
            "engine's own counters over the same replayed requests (`draftsmith canary`, docs/serving.md)."),
        Panel("Canary decisions", [(
            f"sum by (decision) (increase(draftsmith_canary_decisions_total{{{RUN}}}[{RI}]))", "{{decision}}")],
            width=8, description="Trials decided: promote or rollback; each also a line of "
            "runs/<run>/drafters/decisions.jsonl."),
        Panel("Serving drafter version", [(
            f"max by (run) (draftsmith_serving_drafter_version{{{RUN}}})", "v {{run}}")], kind="stat", width=8,
            description="N of the version v<N> on the run's stable route after the last decision."),
        Panel("Refresh loop: stage", [(
            f"max by (stage) (draftsmith_refresh_stage{{{RUN}}})", "{{stage}}")], width=8,
            description="1 for the stage the run's refresh loop is in: idle, build (data), extract, train (and "
            "export), canary (`draftsmith refresh`, docs/serving.md)."),
        Panel("Refresh: seconds per stage, last cycle", [(
            f"max by (stage) (draftsmith_refresh_stage_seconds{{{RUN}}})", "{{stage}}")], unit="s", width=8),
        Panel("Refresh cycles by result", [(
            f"sum by (result) (increase(draftsmith_refresh_cycles_total{{{RUN}}}[{RI}]))", "{{result}}")], width=8,
            description="Cycles that made a version: promoted, rolled_back (the serving drafter kept), failed "
            "(a stage raised; the serving drafter kept)."),
    ],
)

TRAINING = Dashboard(
    "training", "draftsmith / training",
    "EAGLE-3 drafter training with training-time test: loss and top-1 accuracy per TTT step, simulated "
    "acceptance length 1 + sum_j prod_{i<=j} acc_i, learning rate and throughput.",
    run_metric="draftsmith_train_step",
    panels=[
        Panel("Step", [(f"max by (run) (draftsmith_train_step{{{RUN}}})", "{{run}}")], kind="stat", width=6),
        Panel("Epoch", [(f"max by (run) (draftsmith_train_epoch{{{RUN}}})", "{{run}}")], kind="stat", width=6),
        Panel("Simulated acceptance length", [(
            f"max by (run, split) (draftsmith_train_simulated_acceptance_length{{{RUN}}})", "{{run}} {{split}}")],
            width=12, description="1 + sum_j prod_{i<=j} acc_j under greedy chain drafting (bonus token counted)."),
        Panel("Loss per TTT step (train)", [(
            f'max by (ttt_step) (draftsmith_train_loss{{{RUN},split="train"}})', "step {{ttt_step}}")]),
        Panel("Loss per TTT step (held-out)", [(
            f'max by (ttt_step) (draftsmith_train_loss{{{RUN},split="heldout"}})', "step {{ttt_step}}")]),
        Panel("Top-1 accuracy per TTT step (train)", [(
            f'max by (ttt_step) (draftsmith_train_accuracy{{{RUN},split="train"}})', "step {{ttt_step}}")],
            unit="percentunit"),
        Panel("Top-1 accuracy per TTT step (held-out)", [(
            f'max by (ttt_step) (draftsmith_train_accuracy{{{RUN},split="heldout"}})', "step {{ttt_step}}")],
            unit="percentunit"),
        Panel("Learning rate", [(f"max by (run) (draftsmith_train_learning_rate{{{RUN}}})", "{{run}}")],
            unit="sci", width=8),
        Panel("Gradient norm (before clipping)", [(
            f"max by (run) (draftsmith_train_grad_norm{{{RUN}}})", "{{run}}")], width=8),
        Panel("Checkpoints written", [(
            f"sum by (run) (draftsmith_train_checkpoints_total{{{RUN}}})", "{{run}}")], width=8),
        Panel("Tokens / s", [
            (f"sum by (run) (draftsmith_train_tokens_per_second{{{RUN}}})", "{{run}} (last interval)"),
            (f"sum by (run) (rate(draftsmith_train_tokens_total{{{RUN}}}[{RI}]))", "{{run}} (rate)")], width=24),
    ],
)

DASHBOARDS = [GENERATION, EXTRACTION, TRAINING, SERVING]


def _panel_json(p: Panel, pid: int, x: int, y: int) -> dict:
    targets = [
        {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend, "datasource": DATASOURCE}
        for i, (expr, legend) in enumerate(p.exprs)
    ]
    out = {
        "id": pid, "type": p.kind, "title": p.title, "description": p.description, "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": p.width, "x": x, "y": y}, "targets": targets,
        "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
    }
    if p.kind == "stat":
        out["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}
    return out


def dashboard_json(d: Dashboard) -> dict:
    """Grafana dashboard model (schemaVersion 39) of ``d``; panels laid out left to right, 24 columns wide."""
    panels, x, y, row_h = [], 0, 0, 8
    for i, p in enumerate(d.panels, start=1):
        if x + p.width > 24:
            x, y = 0, y + row_h
        panels.append(_panel_json(p, i, x, y))
        x += p.width
    templating = []
    if d.run_metric:
        templating.append({
            "name": "run", "label": "run", "type": "query", "datasource": DATASOURCE,
            "query": {"query": f"label_values({d.run_metric}, run)", "refId": "run"},
            "definition": f"label_values({d.run_metric}, run)",
            "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2,
            "current": {"text": "All", "value": "$__all"},
        })
    return {
        "uid": f"draftsmith-{d.uid}", "title": d.title, "description": d.description, "tags": ["draftsmith"],
        "timezone": "browser", "schemaVersion": 39, "version": 1, "editable": False, "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"}, "templating": {"list": templating}, "panels": panels,
    }


def render(d: Dashboard) -> str:
    """The JSON text written for ``d`` (stable key order, trailing newline)."""
    return json.dumps(dashboard_json(d), indent=2) + "\n"


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for d in DASHBOARDS:
        (OUT / f"{d.uid}.json").write_text(render(d))


if __name__ == "__main__":
    main()
