"""``draftsmith train`` and ``draftsmith export``: train the EAGLE-3 drafter of a run and export it for serving."""

from __future__ import annotations

import json

import typer

from draftsmith.cli import app, settings


@app.command("train")
def train_cmd(
    run: str | None = typer.Option(
        None, "--run", help="Run name (reads runs/<run>/data and features; default: the `run` setting, "
        "DRAFTSMITH_RUN). Under torchrun set DRAFTSMITH_RUN instead: torchrun reads --run as its own --run-path."),
    ttt_steps: int | None = typer.Option(None, "--ttt-steps", help="TTT unroll depth k (train.ttt_steps)."),
    max_steps: int | None = typer.Option(None, "--max-steps", help="Stop after N optimizer steps."),
    epochs: int | None = typer.Option(None, "--epochs", help="Passes over the training split."),
    lr: float | None = typer.Option(None, "--lr", help="Peak learning rate."),
    draft_vocab_size: int | None = typer.Option(None, "--draft-vocab-size", help="Draft vocabulary size N."),
    init_from: str | None = typer.Option(None, "--init-from", help="Pretrained drafter folder to fine-tune."),
    no_resume: bool = typer.Option(False, "--no-resume", help="Start over even if checkpoints exist."),
) -> None:
    """Train the drafter with training-time test; resumes from the latest checkpoint. Use torchrun for DDP."""
    s = settings(run=run, train={"ttt_steps": ttt_steps, "max_steps": max_steps, "epochs": epochs, "lr": lr,
                                 "draft_vocab_size": draft_vocab_size, "init_from": init_from,
                                 "resume": False if no_resume else None})
    from draftsmith import metrics
    from draftsmith.drafter.trainer import Trainer

    trainer = Trainer(s)
    if trainer.dist.main:
        metrics.serve_metrics(s.metrics.port)
    result = trainer.run()
    if trainer.dist.main:
        typer.echo(json.dumps(result, indent=2))


@app.command("export")
def export_cmd(
    run: str = typer.Option(..., "--run", help="Run name."),
    checkpoint: str | None = typer.Option(None, "--checkpoint", help="Checkpoint name or folder (default: latest)."),
    fmt: str | None = typer.Option(None, "--format", help="eagle3, speculators or both (export.format)."),
) -> None:
    """Write runs/<run>/export/<layout>/ for vLLM and SGLang."""
    s = settings(run=run, export={"format": fmt})
    from draftsmith.drafter.checkpoint import resolve_checkpoint
    from draftsmith.drafter.export import export_checkpoint
    from draftsmith.paths import RunPaths
    from draftsmith.target.checkpoint import target_checkpoint

    paths = RunPaths(s.runs_dir, s.run)
    ckpt = resolve_checkpoint(paths.checkpoints, checkpoint)
    target = str(target_checkpoint(s))
    for out in export_checkpoint(ckpt, target, paths.export, s.export.format, s.export.speculative_tokens):
        typer.echo(str(out))
