"""``draftsmith plan``: the whole job sized for a host, one line per problem, before any GPU is used.

It reads the settings a Compose host's ``.env`` gives the services, as ``make`` does (``ENV_FILE``, default
``.env``, handed to Compose with ``--env-file``): the ``DRAFTSMITH_*`` lines as they are, and the variables that the
compose files turn into config keys (``MAX_MODEL_LEN`` -> ``DRAFTSMITH_TARGET__MAX_MODEL_LEN``, ...) under their
key's name; as with ``make``, a variable already set in the shell wins over the file.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from draftsmith.cli import app, settings
from draftsmith.errors import ConfigError
from draftsmith.sizing import Host, Job, detect_host, plan_job
from draftsmith.target.checkpoint import target_checkpoint

# .env variable -> the config key's variable, as compose.yaml / compose.gpu.yaml map it for the services
# (tests/test_plan.py checks each pair against the compose files)
COMPOSE_VARIABLES = {
    "TRUST_REMOTE_CODE": "DRAFTSMITH_TARGET__TRUST_REMOTE_CODE",
    "MAX_MODEL_LEN": "DRAFTSMITH_TARGET__MAX_MODEL_LEN",
    "SERVED_MODEL_NAME": "DRAFTSMITH_TARGET__MODEL",
    "EXTRACT_BACKEND": "DRAFTSMITH_EXTRACT__BACKEND",
    "EXTRACT_GPUS": "DRAFTSMITH_EXTRACT__TENSOR_PARALLEL_SIZE",
    "TRAIN_PARALLEL": "DRAFTSMITH_TRAIN__PARALLEL",
    "GENERATOR_CONCURRENCY": "DRAFTSMITH_GENERATION__CONCURRENCY",  # the generator's `worker --concurrency`
}


def env_file_variables(path: Path | str) -> dict[str, str]:
    """The config variables ``path`` (a Compose ``.env``) gives: ``{"DRAFTSMITH_TARGET__MAX_MODEL_LEN": "65536",
    ...}``; empty values are left out (Compose's defaults apply to them), and so is a missing file.

    Raises:
        ConfigError: the file exists but cannot be read.
    """
    from dotenv import dotenv_values

    path = Path(path)
    if not path.is_file():
        return {}
    try:
        values = dotenv_values(path)
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read {path}: {e}", "fix the file's permissions or pass --env-file") from e
    out: dict[str, str] = {}
    for name, value in values.items():
        if value in (None, ""):
            continue
        if name.startswith("DRAFTSMITH_"):
            out[name] = value
        elif name in COMPOSE_VARIABLES:
            out[COMPOSE_VARIABLES[name]] = value
    return out


def apply_env_file(path: Path | str) -> dict[str, str]:
    """Put the config variables of ``path`` (:func:`env_file_variables`) into this process's environment, except
    those the shell sets already (the shell wins, as with ``make``); returns the ones put in."""
    added = {k: v for k, v in env_file_variables(path).items() if k not in os.environ}
    os.environ.update(added)
    return added


def models_dir_target(path: Path | str) -> Path | None:
    """The target folder ``.env`` names for the services (``MODELS_DIR``/``TARGET_MODEL``, relative to the file's
    folder as Compose reads it), or None when it names none."""
    from dotenv import dotenv_values

    path = Path(path)
    if not path.is_file():
        return None
    values = dotenv_values(path)
    model = os.environ.get("TARGET_MODEL") or values.get("TARGET_MODEL")
    if not model:
        return None
    models = Path(os.environ.get("MODELS_DIR") or values.get("MODELS_DIR") or "./models")
    return (models if models.is_absolute() else path.parent / models) / model


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
    ``TRUST_REMOTE_CODE``, ``EXTRACT_GPUS``, ... as compose maps them; :func:`env_file_variables`), so its fix lines
    and the file they point at agree."""
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
