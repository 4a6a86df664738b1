"""``draftsmith train`` and ``draftsmith export``: train the EAGLE-3 drafter of a run and export it for serving."""

from __future__ import annotations

import typer

from draftsmith.artifacts.checkpoint_store import checkpoint_store
from draftsmith.artifacts.checkpoints import read_state
from draftsmith.artifacts.data import vocab_dir
from draftsmith.artifacts.vocab import mapping_sizes
from draftsmith.cli import app, settings
from draftsmith.cli.options import setting_option
from draftsmith.cli.run_record import settle
from draftsmith.drafter.families import family_of_state, get_family
from draftsmith.drafter.launch import torchrun_argv
from draftsmith.errors import DraftsmithError
from draftsmith.paths import RunPaths
from draftsmith.signals import keep
from draftsmith.staging import staged
from draftsmith.target.checkpoint import target_checkpoint


def train_summary(result: dict, status_file) -> str:
    """Two human lines for the end of ``train``: steps, held-out (else train) top-1 accuracy per TTT step and
    simulated acceptance length, the checkpoint; the full figures stay in ``status_file`` (``status/train.json``)."""
    split = "held-out" if result.get("heldout") else "train"
    fig = result.get("heldout") or result.get("train") or {}
    acc = "/".join(f"{a:.2f}" for a in fig.get("acc") or []) or "-"
    alen = fig.get("accept_len")
    lines = [f"trained {result.get('step', 0)} steps ({result.get('epoch', 0)} epochs); {split}: top-1 accuracy per "
             f"TTT step {acc}, simulated acceptance length {'-' if alen is None else f'{alen:.2f}'}",
             f"checkpoint {result.get('checkpoint', '-')}; every figure: {status_file}"]
    skipped = (result.get("extract_skipped_samples") or 0) + (result.get("nan_feature_samples") or 0)
    if skipped:
        lines.append(f"left out: {skipped} sample(s) with non-finite features")
    return "\n".join(lines)


def with_data_vocab(s):
    """``s`` with ``train.draft_vocab_size`` set to the run's one draft vocabulary when neither it nor
    ``data.draft_vocab_size`` is set here: ``make data`` built the run's vocabulary with the size its command gave
    (``DRAFTSMITH_DATA__DRAFT_VOCAB_SIZE=32000`` in its ``JOB_ENV``), and ``make train``, another container,
    would otherwise ask for the default size and refuse. Several vocabularies, or none: ``s`` unchanged (the
    trainer names the sizes there are).

    Returns:
        The settings, with the size taken (a line on stderr says so) or as they were.
    """
    if s.train.draft_vocab_size is not None or "draft_vocab_size" in s.data.model_fields_set:
        return s
    sizes = mapping_sizes(vocab_dir(RunPaths(s.runs_dir, s.run).data))
    if len(sizes) != 1 or sizes[0] == s.data.draft_vocab_size:
        return s
    typer.echo(f"train.draft_vocab_size {sizes[0]}: the run's one draft vocabulary (data/vocab/draft-{sizes[0]}, "
               "built by `draftsmith build-data`); set train.draft_vocab_size to choose another", err=True)
    return s.model_copy(update={"train": s.train.model_copy(update={"draft_vocab_size": sizes[0]})})


@app.command("train")
def train_cmd(
    run: str | None = typer.Option(
        None, "--run", help="Run name (reads runs/<run>/data and features; default: the `run` setting, "
        "DRAFTSMITH_RUN). Under torchrun set DRAFTSMITH_RUN instead: torchrun reads --run as its own --run-path."),
    family: str | None = setting_option("train.family", "--family"),
    ttt_steps: int | None = setting_option("train.ttt_steps", "--ttt-steps"),
    max_steps: int | None = setting_option("train.max_steps", "--max-steps"),
    epochs: int | None = setting_option("train.epochs", "--epochs"),
    lr: float | None = setting_option("train.lr", "--lr"),
    draft_vocab_size: int | None = setting_option("train.draft_vocab_size", "--draft-vocab-size"),
    init_from: str | None = setting_option("train.init_from", "--init-from"),
    no_resume: bool = typer.Option(False, "--no-resume", help="Start over even if checkpoints exist."),
) -> None:
    """Train the drafter with training-time test; resumes from the latest checkpoint. Use torchrun for DDP."""
    s = settings(run=run, train={"family": family, "ttt_steps": ttt_steps, "max_steps": max_steps, "epochs": epochs,
                                 "lr": lr, "draft_vocab_size": draft_vocab_size, "init_from": init_from,
                                 "resume": False if no_resume else None})
    s = settle(s, "train", lambda m: typer.echo(m, err=True))  # before anything is read or written
    import os

    # the run's own checkpoint store (a URL's sends each checkpoint up as it is saved), picked before the working copy
    checkpoints = checkpoint_store(RunPaths(s.runs_dir, s.run).root, s.stage_dir)
    # every rank reads the run; only the main rank (the one that saves checkpoints) writes its status back
    pushed = ("status",) if int(os.environ.get("RANK", "0")) == 0 else ()
    with staged(s, ("data", "features"), pushed) as s:
        from draftsmith import metrics
        from draftsmith.drafter.trainer import Trainer
        from draftsmith.precision import emulated_bf16_warning

        keep(f"the checkpoints in {checkpoints.folder}")
        trainer = Trainer(with_data_vocab(s), checkpoints=checkpoints)
        if trainer.dist.main and (slow := emulated_bf16_warning(trainer.precision, trainer.dist.device)):
            typer.echo(f"warning: train.precision {slow}", err=True)
        if trainer.dist.main:
            try:
                metrics.serve_metrics(s.metrics.port, s.metrics.addr)
            except DraftsmithError as e:  # a batch job: the training matters more than its live metrics
                typer.echo(f"warning: {e}; training goes on without /metrics", err=True)
        result = trainer.run()
        trainer.close()  # not after an error: a barrier would wait for a rank that may be gone
        if trainer.dist.main:
            typer.echo(train_summary(result, trainer.paths.status / "train.json"))


@app.command("train-launch")
def train_launch_cmd(
    run: str | None = typer.Option(None, "--run", help="Run name (default: the `run` setting, DRAFTSMITH_RUN)."),
    nproc_per_node: int = typer.Option(
        0, "--nproc-per-node", min=0, help="Training processes on this node: one per GPU (0 = every GPU "
        "nvidia-smi lists, or 1 without a GPU)."),
    nnodes: int | None = setting_option("train.nnodes", "--nnodes"),
    rdzv_endpoint: str | None = setting_option("train.rdzv_endpoint", "--rdzv-endpoint"),
) -> None:
    """Start `draftsmith train` under torchrun on this node: --standalone on one node, a c10d rendezvous across
    several (run the same command on every node)."""
    import os

    import torch

    s = settings(run=run, train={"nnodes": nnodes, "rdzv_endpoint": rdzv_endpoint})
    n = nproc_per_node or max(1, torch.cuda.device_count())
    argv = torchrun_argv(s.train.nnodes, s.train.rdzv_endpoint, s.run, n)
    os.environ.update(DRAFTSMITH_RUN=s.run, DRAFTSMITH_TRAIN__NNODES=str(s.train.nnodes))
    if s.train.rdzv_endpoint:
        os.environ["DRAFTSMITH_TRAIN__RDZV_ENDPOINT"] = s.train.rdzv_endpoint
    typer.echo(" ".join(argv[1:]), err=True)
    os.execv(argv[0], argv)  # torchrun takes this process's place: signals reach it, its exit code is ours


@app.command("export")
def export_cmd(
    run: str = typer.Option(..., "--run", help="Run name."),
    checkpoint: str | None = typer.Option(None, "--checkpoint", help="Checkpoint name or folder (default: latest)."),
    fmt: str | None = setting_option("export.format", "--format"),
) -> None:
    """Write runs/<run>/export/<layout>/ for vLLM and SGLang, in the layouts of the checkpoint's drafter family."""
    s = settings(run=run, export={"format": fmt})
    s = settle(s, "export", lambda m: typer.echo(m, err=True))

    checkpoints = checkpoint_store(RunPaths(s.runs_dir, s.run).root, s.stage_dir)
    ckpt = checkpoints.resolve(checkpoint)  # on an object store: the named or latest one comes down, only it
    with staged(s, ("data",), ("export",)) as s:
        paths = RunPaths(s.runs_dir, s.run)
        target = str(target_checkpoint(s))
        family = get_family(family_of_state(read_state(ckpt)))  # the family the checkpoint was trained as
        for out in family.export_checkpoint(ckpt, target, paths.export, s.export.format, s.export.speculative_tokens):
            typer.echo(str(out))
