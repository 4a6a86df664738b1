"""``draftsmith enqueue``, ``draftsmith worker`` and ``draftsmith status`` (generation stage)."""

from __future__ import annotations

import typer

import draftsmith.generation.jobs  # noqa: F401  (registers its pool hooks for the worker; inherited by forks)
from draftsmith.cli import app, settings
from draftsmith.cli.data import _tokenizer_path
from draftsmith.cli.options import setting_option
from draftsmith.config import secret_value
from draftsmith.data.render import load_tokenizer
from draftsmith.generation.enqueue import enqueue as do_enqueue
from draftsmith.generation.selfprompts import synthesize, user_turn_prefix
from draftsmith.jobqueue.pool import run_pool
from draftsmith.jobqueue.queues import queue_name
from draftsmith.paths import RunPaths
from draftsmith.signals import keep
from draftsmith.status import print_status, watch_status
from draftsmith.target.server import resolve_model


@app.command()
def enqueue(
    source: str = typer.Option(None, "--source", "-s", help="JSONL/JSON/Parquet file, dataset folder or hub name. "
                               "Omit to re-enqueue the run's own prompts (resume)."),
    limit: int = typer.Option(None, "--limit", "-n", min=1, help="Extract at most N unique prompts: a seeded "
                              "sample over the whole source (--file-order: its first N)."),
    sample_seed: int = typer.Option(0, "--sample-seed", help="Seed of the --limit sample."),
    file_order: bool = typer.Option(False, "--file-order", help="--limit takes the first N in file order."),
    batch_size: int = setting_option("generation.batch_size", "--batch-size", "-b", min=1),
    run: str = typer.Option(None, "--run", help="Run name."),
    split: str = typer.Option("train", "--split", help="Dataset split for folders and hub names."),
    url: str = setting_option("target.url", "--url"),
    model: str = setting_option("target.model", "--model"),
    max_tokens: int = setting_option("generation.max_tokens", "--max-tokens", min=1),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate and report; enqueue nothing."),
) -> None:
    """Extract unique prompts and enqueue the pending ones as generation jobs."""
    s = settings(run=run, target={"url": url, "model": model},
                 generation={"batch_size": batch_size, "max_tokens": max_tokens})
    do_enqueue(s, source, limit, s.generation.batch_size, dry_run=dry_run, split=split,
               say=lambda m: typer.echo(m, err=False), sample_seed=None if file_order else sample_seed)


@app.command("self-prompts")
def self_prompts(
    n: int = typer.Option(..., "--n", "-n", min=1, help="User requests wanted in the pool (rows already there count)."),
    run: str = typer.Option(None, "--run", help="Run name (the pool is runs/<run>/self_prompts.jsonl)."),
    out: str = typer.Option(None, "--out", help="Write the pool here instead."),
    url: str = setting_option("target.url", "--url"),
    model: str = setting_option("target.model", "--model"),
    seed: int = typer.Option(0, "--seed", help="Sampling seed (request i uses a seed derived from it)."),
    temperature: float = typer.Option(1.0, "--temperature", min=0.0, help="Sampling temperature of the requests."),
    top_p: float = typer.Option(0.9, "--top-p", min=0.01, max=1.0, help="Nucleus of the requests."),
) -> None:
    """Have the target write user requests itself (Magpie), as a prompt pool to enqueue (--source that file)."""
    from pathlib import Path

    s = settings(run=run, target={"url": url, "model": model})
    path = Path(out) if out else RunPaths(s.runs_dir, s.run).self_prompts
    keep(f"the requests written so far in {path}")
    key = secret_value(s.target.api_key)
    served = resolve_model(s.target.url, s.target.model, key)
    prefix = user_turn_prefix(load_tokenizer(_tokenizer_path(s), s.data.chat_template, s.target.trust_remote_code))
    rep = synthesize(s.target.url, served, prefix, n, path, seed=seed, temperature=temperature, top_p=top_p,
                     api_key=key, say=typer.echo)
    typer.echo(rep.line())
    typer.echo(f"enqueue them with: draftsmith enqueue --source {path}")


@app.command()
def worker(
    queues: str = typer.Option("generate", "--queues", "-q", help="Comma-separated stages: generate, extract."),
    processes: int = typer.Option(None, "--processes", "-p", min=1,
                                  help="rq worker processes (default: enough to reach the in-flight cap, "
                                  "ceil(generation.concurrency / generation.batch_size) + 1, for the generate queue)."),
    concurrency: int = setting_option("generation.concurrency", "--concurrency", "-c", min=1),
    burst: bool = typer.Option(False, "--burst", help="Exit when the queues are empty."),
    metrics_port: int = setting_option("metrics.port", "--metrics-port"),
    metrics_addr: str = setting_option("metrics.addr", "--metrics-addr"),
) -> None:
    """Run the rq worker pool (generation and/or extraction jobs)."""
    s = settings(generation={"concurrency": concurrency})
    stages = [q.strip() for q in queues.split(",") if q.strip()]
    for st in stages:
        queue_name(s.redis.prefix, st)  # validates the stage name
    if "extract" in stages:
        from draftsmith.features.jobs import release_when_idle

        release_when_idle(s.extract.release_idle_s)  # resident workers free the target's GPUs between stages
    run_pool(s, stages, processes, burst=burst, metrics_port=metrics_port, metrics_addr=metrics_addr)


@app.command()
def status(
    run: str = typer.Option(None, "--run", help="Run name."),
    watch: bool = typer.Option(False, "--watch", "-w", help="Refresh every --interval seconds until done."),
    interval: float = typer.Option(2.0, "--interval", min=0.2, help="Seconds between refreshes with --watch."),
) -> None:
    """Print the phase and progress of a run's stages (generation from Redis or disk; others from snapshots)."""
    s = settings(run=run)
    if watch:
        watch_status(s, interval)
    else:
        print_status(s)
