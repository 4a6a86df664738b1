"""``draftsmith doctor``: why is the run's acceptance low? Findings ranked by cost, with evidence and fix."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from draftsmith.cli import app, settings
from draftsmith.doctor.finding import ranked
from draftsmith.doctor.run import RunView
from draftsmith.errors import ModelError
from draftsmith.generation.store import pull_records
from draftsmith.paths import RunPaths
from draftsmith.staging import staged
from draftsmith.target.checkpoint import target_checkpoint

PULLED = ("prompts.jsonl", "data", "checkpoints", "export", "eval", "status", "config.yaml")


@app.command("doctor")
def doctor_cmd(
    run: str | None = typer.Option(None, "--run", help="Run name (runs/<run>/ is read)."),
    drafter: Path | None = typer.Option(None, "--drafter", help="Export folder to check (either layout); default: "
                                        "the run's export/eagle3 and export/speculators."),
    url: str | None = typer.Option(None, "--url", help="The serving vLLM server (OpenAI URL): adds the live "
                                   "template round trip (/tokenize) and its served context."),
    json_out: Path | None = typer.Option(None, "--json", help="Also write the findings as JSON to this file."),
) -> None:
    """Name what is costing acceptance: the export against what the engine reads, the loss rows, the draft
    vocabulary coverage, the context and temperature, the chat template, the train/serve gap, the traffic, the data size
    (the run's learning curve). Says which checks needed the server. Exit 0: nothing found; 1: findings; 2: bad input."""
    from draftsmith.doctor.diagnose import diagnose, export_versions, print_report, report, write_json
    s = settings(run=run)
    try:
        settings_target = target_checkpoint(s)
    except ModelError:  # the run's checkpoint usually names the target; the settings' is only a fallback
        settings_target = None
    t0 = time.time()
    # a run on an object store is read from a working copy; the feature shards stay there (the aux ids then come
    # from the checkpoint's drafter config, which holds the same layer ids)
    with staged(s, PULLED, (), fetch=pull_records) as s:  # records through their own format
        view = RunView(RunPaths(s.runs_dir, s.run).root, drafter, settings_target=settings_target)
        results = diagnose(view, url)
        print_report(results, exports=export_versions(view))
        if json_out is not None:
            write_json(json_out, report(view, results, time.time() - t0))
    raise typer.Exit(1 if ranked(results) else 0)
