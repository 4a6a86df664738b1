"""``draftsmith demo``: the main job end to end on the embedded default (``make demo``)."""

from __future__ import annotations

import typer

from draftsmith.artifacts.demo import DEMO_STATE_FILE
from draftsmith.cli import app, settings
from draftsmith.demo import Demo
from draftsmith.demo_sizes import SIZES
from draftsmith.errors import ConfigError
from draftsmith.paths import RunPaths
from draftsmith.signals import keep


@app.command()
def demo(
    run: str = typer.Option("demo", "--run", help="Run name (everything under runs/<run>/)."),
    size: str = typer.Option(
        "default", "--size", help="small (CI, < 10 min), default (< 45 min), mla (the tiny MLA target, "
        "docs/mla.md) or kimi (the tiny Kimi-K2.5-layout target, docs/targets.md)."
    ),
    fresh: bool = typer.Option(False, "--fresh", help="Delete the run and start over."),
) -> None:
    """Prepare and serve SmolLM2 on vLLM CPU, regenerate the bundled prompts, build data, extract, train,
    export and evaluate the drafter in vLLM; resumes finished stages."""
    if size not in SIZES:
        raise ConfigError(f"unknown demo size {size!r}", f"use one of: {', '.join(SIZES)}")
    s = settings(run=run)
    keep(f"the finished stages in {RunPaths(s.runs_dir, s.run).root} ({DEMO_STATE_FILE})")
    Demo(s, SIZES[size].for_this_machine(), say=lambda m: typer.echo(m)).run(fresh=fresh)
