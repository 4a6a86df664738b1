"""``draftsmith eval``: acceptance of the run's drafter in vLLM and/or SGLang, side by side, with reports."""

from __future__ import annotations

from pathlib import Path

import typer

from draftsmith.cli import app, settings


@app.command("eval")
def eval_cmd(
    run: str | None = typer.Option(None, "--run", help="Run name (runs/<run>/export/eagle3 is evaluated)."),
    engine: str | None = typer.Option(None, "--engine", help="vllm, sglang or both."),
    sets: str | None = typer.Option(None, "--sets", help="Comma-separated set names (mt_bench,gsm8k,humaneval,"
                                    "alpaca) or JSONL paths in the EAGLE layout."),
    k: int | None = typer.Option(None, "--k", help="Speculative tokens per step (chain drafting)."),
    url: str | None = typer.Option(None, "--url", help="vLLM server that already serves the drafter."),
    baseline_url: str | None = typer.Option(None, "--baseline-url", help="Server without drafter (speedup)."),
    sglang_url: str | None = typer.Option(None, "--sglang-url", help="SGLang server that serves the drafter."),
    out: Path | None = typer.Option(None, "--out", help="Report folder (default runs/<run>/eval)."),
    drafter: Path | None = typer.Option(None, "--drafter", help="Drafter folder (default runs/<run>/export/eagle3)."),
    limit: int | None = typer.Option(None, "--limit", help="Questions per set."),
    concurrency: int | None = typer.Option(None, "--concurrency", help="Prompts in flight."),
    temperature: float | None = typer.Option(None, "--temperature", help="Sampling temperature (default 0)."),
    max_tokens: int | None = typer.Option(None, "--max-tokens", help="Most new tokens per turn."),
    no_baseline: bool = typer.Option(False, "--no-baseline", help="Skip the run without drafter (no speedup)."),
    offline: bool = typer.Option(False, "--offline", help="Add the offline estimate (transformers, no engine)."),
    print_sglang_command: bool = typer.Option(
        False, "--print-sglang-command", help="Print the SGLang server command for this drafter and exit."
    ),
) -> None:
    """Measure acceptance rate, mean acceptance length, per-position acceptance and speedup; write report.json,
    report.md, report.png and metrics.prom."""
    from draftsmith.evaluation.evaluate import drafter_dir, run_evaluation, target_dir
    from draftsmith.paths import RunPaths

    ev = {"engine": engine, "k": k, "url": url, "baseline_url": baseline_url, "sglang_url": sglang_url, "out": out,
          "drafter": drafter, "limit": limit, "concurrency": concurrency, "temperature": temperature,
          "max_tokens": max_tokens, "sets": [x.strip() for x in sets.split(",") if x.strip()] if sets else None,
          "baseline": False if no_baseline else None}
    s = settings(run=run, eval=ev)
    if print_sglang_command:
        import shlex

        from draftsmith.evaluation.checks import check_drafter_fits
        from draftsmith.evaluation.sglang import SGLangServerSpec

        t, d = target_dir(s), drafter_dir(s, RunPaths(s.runs_dir, s.run))
        check_drafter_fits(t, d)
        typer.echo(shlex.join(SGLangServerSpec(model=t, drafter=d, k=s.eval.k).command()))
        return
    paths = run_evaluation(s, offline=offline)
    typer.echo(paths["md"].read_text())
    for key in ("json", "md", "png", "prom"):
        typer.echo(f"{key}: {paths[key]}")
