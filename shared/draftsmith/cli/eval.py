"""``draftsmith eval``: acceptance of the run's drafter in vLLM and/or SGLang, side by side, with reports."""

from __future__ import annotations

from pathlib import Path

import typer

from draftsmith.cli import app, settings
from draftsmith.cli.options import setting_option
from draftsmith.cli.run_record import settle
from draftsmith.evaluation.checks import check_drafter_fits, check_engine_reads_layout
from draftsmith.paths import RunPaths
from draftsmith.signals import keep
from draftsmith.staging import staged


@app.command("eval")
def eval_cmd(
    run: str | None = typer.Option(None, "--run", help="Run name (runs/<run>/export/eagle3 is evaluated)."),
    engine: str | None = setting_option("eval.engine", "--engine"),
    sets: str | None = setting_option("eval.sets", "--sets", extra="Comma-separated."),
    k: int | None = setting_option("eval.k", "--k"),
    url: str | None = setting_option("eval.url", "--url"),
    baseline_url: str | None = setting_option("eval.baseline_url", "--baseline-url"),
    sglang_url: str | None = setting_option("eval.sglang_url", "--sglang-url"),
    out: Path | None = setting_option("eval.out", "--out"),
    drafter: Path | None = setting_option("eval.drafter", "--drafter"),
    limit: int | None = setting_option("eval.limit", "--limit"),
    concurrency: int | None = setting_option("eval.concurrency", "--concurrency"),
    temperature: float | None = setting_option("eval.temperature", "--temperature"),
    max_tokens: int | None = setting_option("eval.max_tokens", "--max-tokens"),
    no_baseline: bool = typer.Option(False, "--no-baseline", help="Skip the run without drafter (no speedup)."),
    offline: bool = typer.Option(False, "--offline", help="Add the offline estimate (transformers, no engine)."),
    print_sglang_command: bool = typer.Option(
        False, "--print-sglang-command", help="Print the SGLang server command for this drafter and exit."
    ),
) -> None:
    """Measure acceptance rate, mean acceptance length, per-position acceptance and speedup; write report.json,
    report.md, report.png and metrics.prom."""
    from draftsmith.evaluation.evaluate import drafter_dir, run_evaluation, target_dir

    ev = {"engine": engine, "k": k, "url": url, "baseline_url": baseline_url, "sglang_url": sglang_url, "out": out,
          "drafter": drafter, "limit": limit, "concurrency": concurrency, "temperature": temperature,
          "max_tokens": max_tokens, "sets": [x.strip() for x in sets.split(",") if x.strip()] if sets else None,
          "baseline": False if no_baseline else None}
    s = settings(run=run, eval=ev)
    s = settle(s, "eval", lambda m: typer.echo(m, err=True), write=not print_sglang_command)
    with staged(s, ("export", "data"), ("eval",)) as s:
        if print_sglang_command:
            import shlex

            from draftsmith.evaluation.sglang import SGLangServerSpec

            t, d = target_dir(s), drafter_dir(s, RunPaths(s.runs_dir, s.run))
            check_engine_reads_layout("sglang", check_drafter_fits(t, d))
            typer.echo(shlex.join(SGLangServerSpec(model=t, drafter=d, k=s.eval.k).command()))
            return
        keep(f"the reports already in {s.eval.out or RunPaths(s.runs_dir, s.run).eval} (a report is written once every "
             "set is measured)")
        paths = run_evaluation(s, offline=offline)
        typer.echo(paths["md"].read_text())
        for key in ("json", "md", "png", "prom"):
            typer.echo(f"{key}: {paths[key]}")
