"""``draftsmith extract``: the target's hidden states as training features (enqueue rq jobs, or run in-process)."""

from __future__ import annotations

import time

import typer

from draftsmith.cli import app, settings
from draftsmith.cli.options import setting_option
from draftsmith.signals import keep


@app.command("extract")
def extract_cmd(
    run: str = typer.Option(..., "--run", help="Run name (reads runs/<run>/data, writes runs/<run>/features)."),
    backend: str | None = setting_option("extract.backend", "--backend"),
    layers: str | None = typer.Option(
        None, "--layers", help="Aux layer ids a,b,c = outputs of decoder layers (default 1,L//2-1,L-4)."
    ),
    sync: bool = typer.Option(False, "--sync", help="Run the jobs in this process, without Redis."),
    dtype: str | None = setting_option("extract.dtype", "--dtype"),
) -> None:
    """Extract aux and final hidden states of every data shard (resumes: finished shards are skipped).

    Queued (without --sync), the jobs carry the run's settings only (layers, stored dtype); the extraction workers
    use their own backend, device and tensor/expert parallel settings (docs/configuration.md)."""
    from draftsmith.features.plan import check_disk, make_plan
    from draftsmith.features.store import check_compatible, read_sidecar, write_status
    from draftsmith.log import get_logger
    from draftsmith.paths import RunPaths

    log = get_logger("draftsmith.extract")
    layer_list = [int(x) for x in layers.split(",")] if layers else None
    if layers:
        from draftsmith.features.layers import parse_layer_ids

        parse_layer_ids(layers, 10**6)  # shape check only; range is checked against the target below
    s = settings(run=run, extract={"backend": backend, "layers": layer_list, "dtype": dtype})
    from draftsmith.artifacts.location import run_location
    from draftsmith.config import adopt_recorded
    from draftsmith.features.queue import RUN_SECTIONS

    s, adopted = adopt_recorded(s, run_location(s.runs_dir) / s.run, RUN_SECTIONS)
    if adopted:
        typer.echo("continuing with the run's recorded " + ", ".join(
            f"{k}={getattr(s.extract, k.split('.')[1])!r}" for k in adopted) + " (set them to change the run)")
    if backend and not sync:
        typer.echo(f"note: --backend {backend} applies to --sync only; queued jobs run on the extraction workers' "
                   "own extract.backend (DRAFTSMITH_EXTRACT__BACKEND in their environment, EXTRACT_BACKEND in .env)",
                   err=True)
    from draftsmith.artifacts.location import is_remote

    if is_remote(s.runs_dir):
        extract_on_store(s, sync)
        return
    paths = RunPaths(s.runs_dir, s.run)
    keep(f"the finished feature shards in {paths.features}")
    plan = make_plan(s, paths.root)
    check_compatible(plan)
    pending = [i for i in range(len(plan.shards)) if read_sidecar(plan.features_dir, i) is None]
    need, free = check_disk(plan, pending, s.extract.disk_margin)
    log.info(
        "extract %s: backend %s, layers %s (vLLM ids %s), %d/%d shards pending (skipping %d already done)",
        run, plan.backend if sync else "of each worker", plan.layer_ids, [i + 1 for i in plan.layer_ids], len(pending), len(plan.shards),
        len(plan.shards) - len(pending),
    )
    typer.echo(f"feature store: {need / 1e9:.2f} GB to write ({plan.bytes_per_token():,} B/token x "
               f"{sum(sum(plan.shards[i]['lengths']) for i in pending):,} tokens), {free / 1e9:.2f} GB free under "
               f"{plan.features_dir}")
    paths.ensure(paths.features, paths.status)
    write_status(plan, paths.status, started_at=time.time())
    if not pending:
        typer.echo(f"nothing to do: all {len(plan.shards)} feature shards of {run} exist")
        return
    if sync:
        from draftsmith.features.jobs import extract_shard, get_extractor

        extractor = get_extractor(plan, s)
        for i in pending:
            extract_shard(plan, i, extractor, paths.status)
        snap = write_status(plan, paths.status)
        typer.echo(
            f"extracted {snap['shards_done']}/{snap['shards_total']} shards, {snap['samples_done']} samples, "
            f"{snap['tokens_done']} tokens, {snap['bytes_written'] / 1e6:.1f} MB, skipped {snap['skipped_samples']}"
        )
        return
    from draftsmith.features.queue import enqueue_shards

    ids = enqueue_shards(s, str(paths.root), pending)
    typer.echo(f"enqueued {len(ids)} extraction jobs on {s.redis.prefix}:extract; run `draftsmith worker "
               f"--queues extract` to process them")


def extract_on_store(s, sync: bool) -> None:
    """``extract`` of a run on an object store: the pending shards are those without a sidecar in the store; each is
    extracted here (``--sync``) or by a job carrying the run's URL, for an extraction worker on any host
    (:mod:`draftsmith.features.on_store`). The store's feature manifest is rebuilt from its sidecars before and after.

    Raises:
        StorageError: the store failed (finished shards stay in the store).
    """
    from draftsmith.artifacts.location import mask_url, run_key, run_location
    from draftsmith.features.on_store import done_shards, extract_store_shard, plan_on_store, publish_manifest
    from draftsmith.features.store import check_compatible

    root = run_location(s.runs_dir) / s.run
    plan, local = plan_on_store(s, root)
    check_compatible(plan)
    done = done_shards(root)
    pending = [i for i in range(len(plan.shards)) if i not in done]
    publish_manifest(plan, root)
    typer.echo(f"extract {s.run} in {mask_url(run_key(root))}: backend {plan.backend}, layers {plan.layer_ids}, "
               f"{len(pending)}/{len(plan.shards)} shards pending; working copy {local}")
    if not pending:
        typer.echo(f"nothing to do: all {len(plan.shards)} feature shards of {s.run} are in the store")
        return
    if not sync:
        from draftsmith.features.queue import enqueue_shards

        ids = enqueue_shards(s, run_key(root), pending)
        typer.echo(f"enqueued {len(ids)} extraction jobs on {s.redis.prefix}:extract; run `draftsmith worker "
                   f"--queues extract` on any host with the same runs_dir and AWS_* variables")
        return
    keep(f"the feature shards already in {mask_url(run_key(root))}")
    for i in pending:
        extract_store_shard(s, run_key(root), i)
    m = publish_manifest(plan, root)
    typer.echo(f"extracted: {len(m['shards'])}/{len(plan.shards)} shards, {m['samples']} samples, {m['tokens']} "
               f"tokens in {mask_url(run_key(root))}, skipped {m['skipped_samples']}")
