"""Extraction of a run that lives on an object store, one data shard per job, on any host.

A job needs only the run's URL and Redis: it pulls the data manifest, the feature manifest and its one data shard
into the host's working copy (:func:`draftsmith.staging.local_root`), extracts there with the same code as
a local run (:func:`draftsmith.features.jobs.extract_shard`), then pushes the feature shard and, last, its sidecar
with put-if-absent, and removes both from its copy. The store's sidecars are the set of done shards: a sidecar is
only written after its shard, so a host lost between the two leaves a shard that is redone, never a sidecar without
its file.

The store's ``features/manifest.json`` is rebuilt from the listing of sidecars by ``draftsmith extract`` (when it
enqueues, and again when a later call finds nothing left), and every reader rebuilds its local copy's manifest from
the sidecars it pulled (:func:`draftsmith.staging.pull`), so a manifest written while another host was
finishing a shard never hides that shard.
"""

from __future__ import annotations

import json
from typing import Any

from draftsmith.artifacts import data as data_artifact
from draftsmith.artifacts import features as artifact
from draftsmith.artifacts.location import list_names, put_if_absent, read_bytes, run_location, write_bytes
from draftsmith.artifacts.provenance import stamp
from draftsmith.log import get_logger
from draftsmith.staging import local_root, pull, push

log = get_logger(__name__)

FEATURES = "features"
SIDECAR_SUFFIX = ".json"


def done_shards(root: Any) -> set[int]:
    """Indices of the feature shards whose sidecar is in the store under ``root/features`` (one listing call).

    Raises:
        StorageError: the store failed (unreachable, access refused).
    """
    out = set()
    for name in list_names(root / FEATURES, SIDECAR_SUFFIX):
        stem = name[: -len(SIDECAR_SUFFIX)]
        if stem.startswith("features-") and stem[len("features-"):].isdigit():
            out.add(int(stem[len("features-"):]))
    return out


def plan_on_store(s, root: Any):
    """The extraction plan of the run at ``root``, made on the host's working copy after pulling the two manifests
    (the data manifest and, when there is one, the feature manifest the plan is checked against).

    Returns:
        ``(plan, local)``: the :class:`~draftsmith.features.plan.ExtractPlan` of the copy and the copy's folder.

    Raises:
        StorageError: the store failed; DataError / ModelError: as :func:`draftsmith.features.plan.make_plan`.
    """
    from draftsmith.features.plan import make_plan

    local = local_root(s.stage_dir, root)
    pull(root, local, (f"data/{data_artifact.MANIFEST_FILE}", f"{FEATURES}/{artifact.MANIFEST_FILE}"))
    return make_plan(s.model_copy(update={"runs_dir": local.parent}), local), local


def publish_manifest(plan, root: Any) -> dict:
    """Rebuild ``features/manifest.json`` in the store from the store's sidecars and the plan's header (one listing,
    one GET per sidecar, one PUT), and the same file in the working copy.

    Returns:
        The manifest (the shape of :func:`draftsmith.features.store.rebuild_manifest`).

    Raises:
        StorageError: the store failed.
    """
    sides = [json.loads(read_bytes(root / FEATURES / artifact.sidecar_file(i))) for i in sorted(done_shards(root))]
    m = artifact.manifest_from_sidecars(plan.manifest_header(), sides)
    write_bytes(root / FEATURES / artifact.MANIFEST_FILE, json.dumps(stamp(m), indent=1).encode())
    artifact.write_manifest(plan.features_dir, m)
    return m


def extract_store_shard(s, run_url: str, index: int) -> dict:
    """Extract data shard ``index`` of the run at ``run_url`` on this host and put the feature shard in the store.

    Resumes at every step: a shard whose sidecar is in the store is skipped; one finished in the working copy but
    not pushed (the store was away) is pushed without being computed again.

    Returns:
        The result of :func:`draftsmith.features.jobs.extract_shard` (``status`` ``skipped_existing`` when the
        store already had it).

    Raises:
        StorageError: the store failed (what was pushed before stays; the job can be run again).
        DataError: the shard index is out of range, or the store was made with other settings.
    """
    from draftsmith.errors import DataError
    from draftsmith.features.jobs import extract_shard, get_extractor
    from draftsmith.features.store import check_compatible

    root = run_location(run_url)
    side_path = root / FEATURES / artifact.sidecar_file(index)
    if side_path.exists():
        side = json.loads(read_bytes(side_path))
        log.info("shard %05d already in the store (%d samples), skipping", index, len(side["sample_ids"]))
        return {"shard": index, "file": side["file"], "status": "skipped_existing", "samples": len(side["sample_ids"]),
                "skipped": len(side["skipped"]), "tokens": side["tokens"], "bytes": side["bytes"], "seconds": 0.0}
    plan, local = plan_on_store(s, root)
    if not 0 <= index < len(plan.shards):
        raise DataError(f"shard {index} does not exist: the data has {len(plan.shards)} shards", "re-enqueue")
    check_compatible(plan)
    pull(root, local, (f"data/{plan.shards[index]['file']}",))
    from draftsmith.features.store import read_sidecar

    done_here = read_sidecar(plan.features_dir, index) is not None
    result = extract_shard(plan, index, None if done_here else get_extractor(plan, s), local / "status")
    # another host may have finished it meanwhile (a job requeued from a worker taken for dead): its shard stands.
    # Checking before the upload leaves only the upload's own seconds in which two hosts both write the file
    theirs = "shard %05d was finished by another host while this one computed it; theirs is kept"
    if side_path.exists():
        log.warning(theirs, index)
    else:
        push(local, root, (f"{FEATURES}/{artifact.shard_file(index)}",))
        if not put_if_absent(side_path, (plan.features_dir / artifact.sidecar_file(index)).read_bytes()):
            log.warning(theirs, index)
    # the store holds it now: an extraction host's disk holds the shards it has not pushed, not the whole store
    for name in (artifact.sidecar_file(index), artifact.shard_file(index)):
        (plan.features_dir / name).unlink(missing_ok=True)
    return result


def extract_store_job(run_url: str, shard: int, settings: dict) -> dict:
    """rq entry point of a run on an object store: :func:`extract_store_shard` with this worker's host settings and
    the run's settings the job carries (:func:`draftsmith.features.jobs.job_settings`); the job carries the run's
    URL, a shard index and the run's settings.

    Raises:
        ConfigError: the job's run settings disagree with the run's record.
        StorageError / DataError / ModelError: as :func:`extract_store_shard` (rq records the failure).
    """
    from draftsmith.features.jobs import job_settings
    from draftsmith.log import setup_logging

    s = job_settings(run_url, settings, f"extraction job of shard {shard}")
    setup_logging(s.log_level)
    return extract_store_shard(s, run_url, shard)
