"""``draftsmith plan``: the whole job sized for a host, one line per problem, before any GPU is used."""

from __future__ import annotations

from pathlib import Path

import typer

from draftsmith.cli import app, settings


@app.command("plan")
def plan_cmd(
    target: Path = typer.Option(None, "--target", help="Target checkpoint folder (config, tokenizer, weight index; "
                                "no weights needed). Default: target.path, else the embedded target."),
    gpus: int = typer.Option(None, "--gpus", min=0, help="GPUs of the host (default: what nvidia-smi lists)."),
    gpu_memory_gb: float = typer.Option(None, "--gpu-memory-gb", min=0, help="Memory per GPU in GB (default: "
                                        "nvidia-smi's smallest GPU)."),
    disk_free_gb: float = typer.Option(None, "--disk-free-gb", min=0, help="Free disk for runs_dir in GB (default: "
                                       "measured)."),
    prompts: int = typer.Option(10000, "--prompts", min=1, help="Prompts to regenerate."),
    prompt_tokens: int = typer.Option(200, "--prompt-tokens", min=1, help="Mean prompt length, in tokens."),
    answer_tokens: int = typer.Option(None, "--answer-tokens", min=1, help="Mean answer length with its reasoning, "
                                      "in tokens (default: generation.max_tokens, the longest)."),
    env_file: Path = typer.Option(None, "--env-file", help="The Compose host's settings file, read as `make` reads "
                                  "it (default: $ENV_FILE, else .env in this folder); the shell's variables win."),
) -> None:
    """Size the job (generation, extraction, training) for this host or the one given: engine flags, GPU split,
    context, drafter memory, feature-store bytes. Exits 2 with one line per problem (docs/targets.md).

    Reads the settings the services get from ``.env`` (``DRAFTSMITH_*`` lines, and ``MAX_MODEL_LEN``,
    ``TRUST_REMOTE_CODE``, ``EXTRACT_GPUS``, ... as compose maps them; :mod:`draftsmith.envfile`), so its fix lines
    and the file they point at agree."""
    import os

    from draftsmith.envfile import apply_env_file, models_dir_target
    from draftsmith.sizing import Host, Job, detect_host, plan_job
    from draftsmith.target.checkpoint import target_checkpoint

    env_file = env_file or Path(os.environ.get("ENV_FILE") or ".env")
    added = apply_env_file(env_file)
    if added:
        typer.echo(f"settings from {env_file}: {', '.join(sorted(added))}")
    s = settings()
    folder = target or (None if s.target.path else models_dir_target(env_file)) or target_checkpoint(s)
    found = detect_host(s.runs_dir)
    host = Host(found.gpus if gpus is None else gpus, found.gpu_memory_gb if gpu_memory_gb is None else gpu_memory_gb,
                found.disk_free_gb if disk_free_gb is None else disk_free_gb)
    typer.echo(f"host: {host.gpus} GPU(s) of {host.gpu_memory_gb:.0f} GB, {host.disk_free_gb:.0f} GB free disk")
    plan = plan_job(s, Path(folder), host, Job(prompts, prompt_tokens, answer_tokens or s.generation.max_tokens))
    for line in plan.lines:
        typer.echo(line)
    for line in plan.problems:
        typer.echo(f"problem: {line}", err=True)
    if plan.problems:
        raise typer.Exit(2)
    typer.echo("no problem found")
