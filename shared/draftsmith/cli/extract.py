"""``draftsmith extract``: the target's hidden states as training features (enqueue rq jobs, or run in-process)."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from draftsmith.artifacts.features import load_manifest
from draftsmith.artifacts.location import mask_url, run_location
from draftsmith.cli import app, settings
from draftsmith.cli.options import setting_option
from draftsmith.config import adopt_recorded
from draftsmith.features.layers import parse_layer_ids
from draftsmith.features.queue import RUN_SECTIONS, enqueue_shards
from draftsmith.log import get_logger
from draftsmith.paths import RunPaths
from draftsmith.signals import keep


@app.command("extract")
def extract_cmd(
    run: str = typer.Option(
        ..., "--run", help="Run name (reads runs/<run>/data, writes runs/<run>/features)."
    ),
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
    from draftsmith.features.on_store import feature_store
    from draftsmith.features.store import write_status
    layer_list = [int(x) for x in layers.split(",")] if layers else None
    if layers:
        parse_layer_ids(layers, 10**6)  # shape check only; range is checked against the target below
    s = settings(run=run, extract={"backend": backend, "layers": layer_list, "dtype": dtype})
    s, adopted = adopt_recorded(s, run_location(s.runs_dir) / s.run, RUN_SECTIONS)
    if adopted:
        typer.echo(
            "continuing with the run's recorded "
            + ", ".join(f"{k}={getattr(s.extract, k.split('.')[1])!r}" for k in adopted)
            + " (set them to change the run)"
        )
    if backend and not sync:
        typer.echo(
            f"note: --backend {backend} applies to --sync only; queued jobs run on the extraction workers' "
            "own extract.backend (DRAFTSMITH_EXTRACT__BACKEND in their environment, EXTRACT_BACKEND in .env)",
            err=True,
        )
    store = feature_store(run_location(s.runs_dir) / s.run, s.stage_dir)
    where = mask_url(store.key)
    keep(f"the finished feature shards in {where}/features")
    plan, pending = plan_pending(s, store, sync)
    paths = RunPaths(Path(plan.run_dir).parent, s.run)
    paths.ensure(paths.features, paths.status)
    store.rebuild_manifest(manifest_header(plan, sync))
    write_status(plan, paths.status, started_at=time.time())
    if not pending:
        typer.echo(f"nothing to do: all {len(plan.shards)} feature shards of {run} exist in {where}")
        return
    if sync:
        extract_here(s, store, plan, pending, paths.status)
        return
    ids = enqueue_shards(s, str(store.root), pending)
    typer.echo(
        f"enqueued {len(ids)} extraction jobs on {s.redis.prefix}:extract; run `draftsmith worker "
        f"--queues extract` to process them (on any host with the same runs_dir and, for an object store, "
        "its AWS_* variables)"
    )


def extract_here(s, store, plan, pending: list[int], status_dir: Path) -> None:
    """``extract --sync``: the ``pending`` shards extracted in this process, each handed to the run's
    :class:`~draftsmith.artifacts.features.FeatureStore` as it finishes; the manifest rebuilt from the store's
    sidecars after the last.

    Raises:
        DataError / ModelError / StorageError / DiskSpaceError: as
            :func:`draftsmith.features.jobs.extract_into_store` (finished shards stay).
    """
    from draftsmith.features.jobs import extract_into_store
    from draftsmith.features.store import write_status

    for i in pending:
        extract_into_store(s, store, plan, i)
    m = store.rebuild_manifest(plan.manifest_header())
    snap = write_status(plan, status_dir)
    typer.echo(
        f"extracted {len(m['shards'])}/{snap['shards_total']} shards, {m['samples']} samples, "
        f"{m['tokens']} tokens, {snap['bytes_written'] / 1e6:.1f} MB, skipped {m['skipped_samples']}"
    )


def manifest_header(plan, sync: bool) -> dict:
    """The run-level fields of the features manifest this call writes: the plan's, except that a queued call keeps
    the ``backend`` the manifest already names. Queued jobs run on the extraction workers' own backend, which this
    process does not know (it enqueues from the generator container on the Compose stack): its own default would
    overwrite what the workers recorded, and rewrite the manifest of a run with nothing to do."""
    header = plan.manifest_header()
    old = None if sync else load_manifest(Path(plan.features_dir))
    if old and old.get("backend"):
        header["backend"] = old["backend"]
    return header


def plan_pending(s, store, sync: bool) -> tuple:
    """The run's extraction plan (made on the store's working copy, checked against the features already there) and
    its pending shards, with the disk the working copy needs checked and the plan printed.

    Returns:
        ``(plan, pending)``: the :class:`~draftsmith.features.plan.ExtractPlan` and the shard indices not yet in the
        store.

    Raises:
        DataError: the store holds features made with other settings; DiskSpaceError: the working copy's disk lacks
            room; StorageError: the object store failed.
    """
    from draftsmith.features.on_store import plan_of
    from draftsmith.features.plan import check_disk
    from draftsmith.features.store import check_compatible
    log = get_logger("draftsmith.extract")
    where = mask_url(store.key)
    plan = plan_of(store, s)
    check_compatible(plan)
    done = store.done_shards()
    pending = [i for i in range(len(plan.shards)) if i not in done]
    # the working copy holds every pending shard, or (on an object store) the one in hand until it is handed over
    held = (
        pending if store.keeps_shards else sorted(pending, key=lambda i: sum(plan.shards[i]["lengths"]))[-1:]
    )
    need, free = check_disk(plan, held, s.extract.disk_margin)
    log.info(
        "extract %s in %s: backend %s, layers %s (vLLM ids %s), %d/%d shards pending (skipping %d already done)",
        s.run,
        where,
        plan.backend if sync else "of each worker",
        plan.layer_ids,
        [i + 1 for i in plan.layer_ids],
        len(pending),
        len(plan.shards),
        len(plan.shards) - len(pending),
    )
    typer.echo(
        f"feature store: {need / 1e9:.2f} GB to write ({plan.bytes_per_token():,} B/token x "
        f"{sum(sum(plan.shards[i]['lengths']) for i in held):,} tokens), {free / 1e9:.2f} GB free under "
        f"{plan.features_dir}"
    )
    return plan, pending
