"""``draftsmith canary``: try a drafter version beside the serving one; promote it or roll it back."""

from __future__ import annotations

import time
from pathlib import Path

import redis
import typer

from draftsmith.artifacts.export import EAGLE3, layout_dir
from draftsmith.cli import app, settings
from draftsmith.cli.options import setting_option
from draftsmith.paths import RunPaths
from draftsmith.serving.routes import Routes, read_routes, write_routes
from draftsmith.serving.versions import list_versions as versions
from draftsmith.serving.versions import read_serving, versions_dir, write_serving


@app.command("canary")
def canary_cmd(
    drafter: str = typer.Argument(None, help="Export folder to try (copied into a new version drafters/v<N>) or a "
                                  "version of the run (v3); default: the run's export/eagle3."),
    run: str | None = typer.Option(None, "--run", help="Run name (runs/<run>/drafters holds its versions)."),
    stable_url: str | None = typer.Option(None, "--stable-url", help="The engine serving the run now (without /v1): "
                                          "written to the routes when the run has none yet."),
    stable_version: str | None = typer.Option(None, "--stable-version", help="The version it serves (v1), with "
                                              "--stable-url."),
    share: float | None = setting_option("canary.share", "--share"),
    min_requests: int | None = setting_option("canary.min_requests", "--min-requests"),
    threshold: float | None = setting_option("canary.threshold", "--threshold"),
    confidence: float | None = setting_option("canary.confidence", "--confidence"),
    k: int | None = setting_option("eval.k", "--k"),
    list_versions: bool = typer.Option(False, "--list", help="List the run's versions and the serving one; exit."),
    adopt: bool = typer.Option(False, "--adopt", help="No trial: record the drafter that the engine at --stable-url "
                               "already serves (DRAFTER, default the run's export/eagle3) as the run's first version "
                               "and write the routes, where canaries and refreshes then start from; exit."),
) -> None:
    """Serve the candidate on a second vLLM engine, replay the same requests to both, compare acceptance from each
    engine's counters (paired bootstrap interval), then promote (routes' stable -> candidate; this command keeps
    the promoted engine serving until Ctrl-C) or roll back (candidate stopped). Exit 0: promoted; 3: rolled back."""
    from draftsmith.serving.canary import run_canary

    s = settings(run=run, canary={"share": share, "min_requests": min_requests, "threshold": threshold,
                                  "confidence": confidence}, eval={"k": k})
    paths = RunPaths(s.runs_dir, s.run)
    if list_versions:
        serving = (read_serving(paths.root) or {}).get("version")
        for v in versions(paths.root):
            typer.echo(f"{v.name}{' (serving)' if v.name == serving else ''}  {v.provenance.get('export')}")
        return
    client = redis.Redis.from_url(s.redis.url)
    if adopt:
        from draftsmith.serving.canary import adopt as adopt_version

        if not stable_url:
            raise typer.BadParameter("--adopt needs --stable-url: the engine that serves the drafter now")
        v, adopted = adopt_version(s, Path(drafter) if drafter else layout_dir(paths.export, EAGLE3), stable_url,
                                   client)
        typer.echo(f"{v.name} serves run {s.run}" + (f" at {stable_url} (routes written)" if adopted else
                                                        " already (nothing adopted)") +
                   f"; try new drafters with `draftsmith canary EXPORT_DIR --run {s.run}` or `draftsmith refresh`")
        return
    from draftsmith.metrics import serve_metrics

    serve_metrics(s.metrics.port, s.metrics.addr)  # the decision counters, while the trial runs and the hold lasts
    if stable_url and read_routes(client, s.redis.prefix, s.run) is None:
        write_routes(client, s.redis.prefix, s.run, Routes(stable=stable_url.rstrip("/"), stable_drafter=stable_version))
        if stable_version:
            write_serving(paths.root, stable_version, stable_url)
    outcome = run_canary(s, drafter or str(layout_dir(paths.export, EAGLE3)), client)
    r = outcome.record
    typer.echo(f"{r['decision']}: {r['candidate']} vs {r['current']}, ratio {r['interval_ratio']:.3f} "
               f"[{r['interval_low']:.3f}, {r['interval_high']:.3f}] over {r['interval_pairs']} requests "
               f"(threshold {r['threshold']}); decisions: {versions_dir(paths.root)}")
    if outcome.engine is None:
        raise typer.Exit(3)
    typer.echo(f"{r['candidate']} serves the stable route at {outcome.engine.url}; Ctrl-C stops it")
    try:
        while outcome.engine.proc and outcome.engine.proc.poll() is None:
            time.sleep(1)
    finally:
        outcome.engine.stop()
