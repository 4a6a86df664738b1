"""``draftsmith refresh``: new drafter versions from captured traffic, continued from the serving one, tried on the
canary (docs/serving.md, "Refresh")."""

from __future__ import annotations

import time

import typer

from draftsmith.cli import app, settings
from draftsmith.cli.options import engine_args_help, setting_help, setting_option, with_engine_args
from draftsmith.cli.run_record import check_stage


class _RunRecipe:
    """The loop's ``run_settings``: ``s`` with the run's recorded data, extraction and training settings taken where
    ``s`` leaves them unset (a run setting given otherwise than the run recorded refuses the cycle,
    cli/run_record.py); says which it took whenever that changes."""

    def __init__(self) -> None:
        self.said: list[str] | None = None

    def __call__(self, s):
        s, taken = check_stage(s, "refresh")
        if taken and taken != self.said:
            typer.echo(f"refresh: continuing with the run's recorded {', '.join(taken)}")
        self.said = taken
        return s


@app.command("refresh")
def refresh_cmd(
    run: str | None = typer.Option(None, "--run", help="Run name (its records, drafters/ and routes)."),
    once: bool = typer.Option(False, "--once", help="One cycle, then exit (0: refreshed and promoted or nothing to "
                              "do; 3: the canary rolled the new version back)."),
    force: bool = typer.Option(False, "--force", help="Refresh now whatever the trigger says (with --once)."),
    min_new_records: int | None = setting_option("refresh.min_new_records", "--min-new-records"),
    acceptance_floor: float | None = setting_option("refresh.acceptance_floor", "--acceptance-floor"),
    poll_s: float | None = setting_option("refresh.poll_s", "--poll-s"),
    max_steps: int | None = setting_option("refresh.max_steps", "--max-steps"),
    eager: bool = typer.Option(None, "--eager/--compiled", help=setting_help("target.enforce_eager")),
    engine_args: list[str] = typer.Argument(None, help=engine_args_help()),
) -> None:
    """Check the run every refresh.poll_s: when enough traffic was captured (or live acceptance fell below the
    floor), build data over all records, extract, train from the serving version, export, and try it on the canary.
    A promoted engine is kept serving while this command runs; SIGTERM/Ctrl-C stops it and the loop."""
    from draftsmith.metrics import serve_metrics
    from draftsmith.serving.refresh import Loop

    s = settings(run=run, refresh={"min_new_records": min_new_records, "acceptance_floor": acceptance_floor,
                                   "poll_s": poll_s, "max_steps": max_steps})
    s = with_engine_args(s, eager, engine_args)
    serve_metrics(s.metrics.port, s.metrics.addr)  # the canary's decision counters
    loop = Loop(s, run_settings=_RunRecipe())
    typer.echo(f"refresh for run {s.run}: every {s.refresh.poll_s:.0f} s, at {s.refresh.min_new_records} new "
               f"traffic records or live acceptance below {s.refresh.acceptance_floor}" + (" (once)" if once else ""))
    try:
        if not once:
            loop.run(typer.echo)
            return
        result = loop.cycle(force)
        typer.echo(result.trigger.line())
        if result.outcome is None:
            return
        r = result.outcome.record
        typer.echo(f"{r['decision']}: {r['candidate']} vs {r['current']}, ratio {r['interval_ratio']:.3f} "
                   f"[{r['interval_low']:.3f}, {r['interval_high']:.3f}]; work folder {result.work_dir}")
        if loop.engine is None:
            raise typer.Exit(3)
        typer.echo(f"{r['candidate']} serves the stable route at {loop.engine.url}; Ctrl-C stops it")
        while loop.engine.proc and loop.engine.proc.poll() is None:
            time.sleep(1)
    finally:
        loop.close()
