"""The rq job of extraction: one data shard in, one feature shard out. Jobs carry ids and paths, never tensors.

``draftsmith worker --queues extract`` runs :func:`extract_job` (JSON serializer) in resident workers, which keep
the loaded target between shards; ``draftsmith extract --sync`` calls :func:`extract_shard` in-process.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from draftsmith.artifacts.features import FeatureStore
from draftsmith.artifacts.run_settings import check_job
from draftsmith.artifacts.status import STATUS_DIR
from draftsmith.config import run_settings, settings_for_job
from draftsmith.errors import DataError, EngineError
from draftsmith.features.hf import HFExtractor, torch_dtype
from draftsmith.features.on_store import feature_store, plan_of
from draftsmith.features.plan import ExtractPlan, read_data_shard
from draftsmith.features.queue import RUN_SECTIONS
from draftsmith.features.store import (
    check_compatible,
    finish_shard,
    open_shard,
    read_sidecar,
    rebuild_manifest,
    remove_stale_temps,
    write_status,
)
from draftsmith.jobqueue.hooks import when_idle
from draftsmith.log import get_logger, setup_logging
from draftsmith.target.checkpoint import weights_bytes

log = get_logger(__name__)

_EXTRACTORS: dict[tuple, Any] = {}


def extraction_gpus(plan: ExtractPlan, settings) -> list[int]:
    """CUDA device indices the extraction of ``plan`` loads the target onto: ``extract.tensor_parallel_size``
    devices from 0 for the vllm backend, the one of ``extract.device`` for hf; none on a machine without CUDA."""
    if not torch.cuda.is_available():
        return []
    if plan.backend == "vllm":
        return list(range(settings.extract.tensor_parallel_size))
    dev = torch.device(settings.extract.device)
    return [dev.index or 0] if dev.type == "cuda" else []


def require_free_gpus(target_dir: Path, devices: list[int], mem_get_info=None, margin: float = 1.1) -> None:
    """Refuse, in one line, to load the target onto GPUs that something else holds (the target service, most often:
    it and the extractor must never share GPUs).

    Each device needs ``margin`` x the target's weights / ``len(devices)`` free (weights from the weight index,
    :func:`draftsmith.target.checkpoint.weights_bytes`; unknown: nothing is checked).

    Args:
        mem_get_info: ``torch.cuda.mem_get_info`` (``(free, total)`` bytes of a device); a stand-in in tests, which
            have no GPU.

    Raises:
        EngineError: a device has less free memory than its share; the message names the devices and the fix.
    """
    wb = weights_bytes(Path(target_dir))
    if not devices or not wb:
        return
    if mem_get_info is None:
        mem_get_info = torch.cuda.mem_get_info
    need = wb * margin / len(devices)
    short = {i: mem_get_info(i)[0] for i in devices}
    short = {i: free for i, free in short.items() if free < need}
    if short:
        got = ", ".join(f"GPU {i}: {free / 1e9:.1f} GB free" for i, free in short.items())
        raise EngineError(f"the target needs {need / 1e9:.1f} GB on each of GPUs {devices} for extraction; {got}",
                          "another process holds them, most often the target service: stop it first "
                          "(docker compose -p draftsmith stop target-vllm target-sglang), then run the extractor")


def get_extractor(plan: ExtractPlan, settings) -> Any:
    """The backend object for a plan (cached per process): anything with ``extract(seqs) -> [SampleFeatures]``.

    The cache lives as long as the process: in ``draftsmith extract --sync`` and in a resident extraction worker
    (:class:`draftsmith.jobqueue.worker.ResidentWorker`) the target is loaded once for every shard.

    Raises:
        ModelError / EngineError: the backend cannot load the target.
    """
    from draftsmith import metrics as M

    x = settings.extract
    key = (plan.backend, plan.target_dir, tuple(plan.layer_ids), x.device, plan.compute_dtype, x.batch_tokens)
    if key not in _EXTRACTORS:
        log.info("loading target %s for extraction (backend %s, %s, %s; pid %d)", plan.target_dir, plan.backend,
                 x.device, plan.compute_dtype, os.getpid())
        require_free_gpus(Path(plan.target_dir), extraction_gpus(plan, settings))
        if plan.backend == "vllm":
            from draftsmith.features.vllm_backend import VLLMExtractor

            _EXTRACTORS[key] = VLLMExtractor.from_plan(plan, settings)
        else:
            _EXTRACTORS[key] = HFExtractor.load(
                Path(plan.target_dir), plan.layer_ids, x.device, plan.compute_dtype, x.batch_tokens,
                settings.target.trust_remote_code,
            )
        M.EXTRACT_TARGET_LOADS.labels(plan.backend).inc()
        M.EXTRACT_TARGET_HELD.labels(plan.backend).set(1)
    return _EXTRACTORS[key]


def release_extractors(idle_s: float = 0.0) -> int:
    """Free every target this process holds for extraction (the backend object, its engine and, on CUDA, its
    cached GPU memory); the next :func:`get_extractor` loads it again.

    Args:
        idle_s: seconds the worker's queue has been empty, for the log line.

    Returns:
        How many loaded targets were freed (0: none was held).
    """
    import gc

    from draftsmith import metrics as M

    held = list(_EXTRACTORS)
    if not held:
        return 0
    for key in held:
        close = getattr(_EXTRACTORS.pop(key), "close", None)
        if close is not None:
            close()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    for key in held:
        M.EXTRACT_TARGET_HELD.labels(key[0]).set(0)
        log.info("released target %s after %.0f s with an empty queue (extract.release_idle_s): its memory and GPUs "
                 "are free; the next job loads it again (pid %d)", key[1], idle_s, os.getpid())
    return len(held)


def release_when_idle(after_s: float) -> None:
    """Have this process's resident extraction workers free the target once their queue has been empty for
    ``after_s`` seconds (``extract.release_idle_s``; 0 = keep it for the life of the worker)."""
    when_idle(after_s, release_extractors)


def finite(t: torch.Tensor) -> bool:
    """True when every value of ``t`` is finite."""
    return bool(torch.isfinite(t).all())


def extract_shard(plan: ExtractPlan, index: int, extractor: Any, status_dir: Path | None = None) -> dict:
    """Compute and store the features of data shard ``index``; skip it if already complete.

    Samples whose features hold NaN or Inf (after the cast to the stored dtype) are left out, counted in the
    sidecar's ``skipped`` and in ``draftsmith_extract_skipped_samples`` (failure mode 10, SpecForge #104).
    Memory: the features of at most one group of ``plan.write_tokens`` tokens are held at a time
    (:func:`draftsmith.features.writer.write_groups`); each group goes to the shard file before the next is made.

    Returns:
        ``{"shard", "file", "status": "done"|"skipped_existing", "samples", "skipped", "tokens", "bytes",
        "seconds"}``.

    Raises:
        DataError: the data shard disagrees with its manifest, or the store was made with other settings.
    """
    from draftsmith import metrics as M

    run = Path(plan.run_dir).name
    status_dir = status_dir or Path(plan.run_dir) / STATUS_DIR
    done = read_sidecar(plan.features_dir, index)
    if done is not None:
        log.info("shard %05d already extracted (%d samples), skipping", index, len(done["sample_ids"]))
        return {"shard": index, "file": done["file"], "status": "skipped_existing", "samples": len(done["sample_ids"]),
                "skipped": len(done["skipped"]), "tokens": done["tokens"], "bytes": done["bytes"], "seconds": 0.0}
    check_compatible(plan)
    if n := remove_stale_temps(plan.features_dir, index):
        log.warning("removed %d temporary file(s) of shard %05d left by a killed job", n, index)
    side = _extract_into_shard(plan, index, extractor, run)
    seconds = side["seconds"]
    ids, skipped = side["sample_ids"], side["skipped"]
    manifest = rebuild_manifest(plan)
    snap = write_status(plan, status_dir)
    M.EXTRACT_SAMPLES.labels(run).inc(len(ids))
    M.EXTRACT_TOKENS.labels(run).inc(side["tokens"])
    M.EXTRACT_BYTES.labels(run).inc(side["bytes"])
    M.EXTRACT_SHARD_SECONDS.labels(run).observe(seconds)
    M.EXTRACT_SHARDS_DONE.labels(run).set(len(manifest["shards"]))
    M.EXTRACT_SHARDS_TOTAL.labels(run).set(len(plan.shards))
    M.EXTRACT_TOKENS_PER_S.labels(run).set(side["tokens"] / max(seconds, 1e-9))
    M.EXTRACT_FREE_DISK.labels(run).set(shutil.disk_usage(plan.features_dir).free)
    log.info(
        "shard %05d: %d samples, %d tokens, %.1f MB in %.1f s (%.0f tok/s), skipped %d; shards %d/%d",
        index, len(ids), side["tokens"], side["bytes"] / 1e6, seconds, side["tokens"] / max(seconds, 1e-9),
        len(skipped), snap["shards_done"], snap["shards_total"],
    )
    return {"shard": index, "file": side["file"], "status": "done", "samples": len(ids), "skipped": len(skipped),
            "tokens": side["tokens"], "bytes": side["bytes"], "seconds": round(seconds, 3)}


def _extract_into_shard(plan: ExtractPlan, index: int, extractor: Any, run: str) -> dict:
    """Extract data shard ``index`` group by group into its feature shard file; returns the sidecar
    (:func:`draftsmith.features.store.finish_shard`)."""
    from draftsmith import metrics as M
    from draftsmith.features.writer import write_budget, write_groups

    entry = plan.shards[index]
    t0 = time.time()
    seqs = read_data_shard(plan.data_dir, entry)  # token ids only: 8 bytes a token against 4 x H x 2 of features
    lengths = [int(q.numel()) for q in seqs]
    budget = write_budget(plan.write_tokens, plan.hidden_size, plan.batch_tokens)
    groups = write_groups(lengths, plan.batch_tokens, budget)
    log.debug("shard %05d: %d tokens in %d group(s) of at most %d tokens", index, sum(lengths), len(groups), budget)
    store = torch_dtype(plan.dtype)
    skipped: dict[int, dict] = {}
    with open_shard(plan, index, lengths) as writer:
        for group in groups:
            for i, f in zip(group, extractor.extract([seqs[i] for i in group]), strict=True):
                a, h = f.aux.to(store), f.final.to(store)  # [T, 3*H], [T, H]
                if finite(a) and finite(h):
                    writer.put(i, a, h)
                    continue
                sid = entry["sample_ids"][i]
                log.warning("sample %s of shard %05d has NaN/Inf features: skipped", sid, index)
                skipped[i] = {"id": sid, "reason": "nonfinite"}
                M.EXTRACT_SKIPPED.labels(run, "nonfinite").inc()
                writer.skip(i)
        return finish_shard(plan, index, writer, entry["sample_ids"], [skipped[i] for i in sorted(skipped)],
                            time.time() - t0)


def job_settings(run_dir: str, settings: dict, what: str):
    """The settings an extraction job runs with: this worker's own (backend, device, parallelism, paths) with the
    run keys the job carries put in (:func:`draftsmith.config.settings_for_job`), after checking those against the
    run's record.

    Raises:
        ConfigError: the job's run settings disagree with the run's record (both values named), or are invalid.
    """
    s = settings_for_job(settings)
    check_job(run_dir, run_settings(s), RUN_SECTIONS, what, "draftsmith extract")
    x = s.extract
    log.info("%s: run settings from the job; this worker's backend %s, device %s, tensor parallel %d, expert "
             "parallel %s, batch_tokens %d", what, x.backend, x.device, x.tensor_parallel_size,
             x.enable_expert_parallel, x.batch_tokens)
    return s


def host_of(s) -> dict[str, Any]:
    """The host settings an extraction ran with, for its job result: ``{"backend", "device", "compute_dtype",
    "tensor_parallel_size", "enable_expert_parallel", "batch_tokens", "write_tokens"}``."""
    x = s.extract
    return {"backend": x.backend, "device": x.device, "compute_dtype": x.compute_dtype,
            "tensor_parallel_size": x.tensor_parallel_size, "enable_expert_parallel": x.enable_expert_parallel,
            "batch_tokens": x.batch_tokens, "write_tokens": x.write_tokens}


def _already_stored(index: int, side: dict) -> dict:
    log.info("shard %05d already in the store (%d samples), skipping", index, len(side["sample_ids"]))
    return {"shard": index, "file": side["file"], "status": "skipped_existing", "samples": len(side["sample_ids"]),
            "skipped": len(side["skipped"]), "tokens": side["tokens"], "bytes": side["bytes"], "seconds": 0.0}


def extract_into_store(s, store: FeatureStore, plan: ExtractPlan, index: int, extractor: Any = None) -> dict:
    """Extract data shard ``index`` in the store's working copy and hand the feature shard to the store: the one
    walk of a shard, whatever the run's location.

    Resumes at every step: a shard the store holds is skipped; one finished in the working copy but not handed over
    (the store was away) is handed over without being computed again.

    Args:
        extractor: a loaded extractor to reuse (``extract --sync``), or None to take this worker's
            (:func:`get_extractor`) when the shard must be computed.

    Returns:
        The result of :func:`extract_shard` (``status`` ``skipped_existing`` when the store already had it).

    Raises:
        DataError: the shard index is out of range, or the store was made with other settings.
        StorageError: the object store failed (what was handed over before stays; the job can be run again).
        DiskSpaceError: the working copy's disk filled up (finished shards are kept).
    """
    side = store.sidecar(index)
    return _already_stored(index, side) if side is not None else _extract_and_hand_over(s, store, plan, index, extractor)


def _extract_and_hand_over(s, store: FeatureStore, plan: ExtractPlan, index: int, extractor: Any = None) -> dict:
    """:func:`extract_into_store` of a shard the store was just found not to hold."""
    if not 0 <= index < len(plan.shards):
        raise DataError(f"shard {index} does not exist: the data has {len(plan.shards)} shards", "re-enqueue")
    check_compatible(plan)
    store.fetch((f"data/{plan.shards[index]['file']}",))
    if extractor is None and read_sidecar(plan.features_dir, index) is None:
        extractor = get_extractor(plan, s)
    result = extract_shard(plan, index, extractor, Path(plan.run_dir) / STATUS_DIR)
    if not store.publish(index):
        log.warning("shard %05d was finished by another host while this one computed it; theirs is kept", index)
    return result


def extract_job(run_dir: str, shard: int, settings: dict) -> dict:
    """rq entry point: extract data shard ``shard`` of the run at ``run_dir`` (:func:`extract_into_store`).

    Args:
        run_dir: ``runs/<run>``: a path, or an object-store URL (the job carries no tensors).
        shard: data shard index.
        settings: the run's settings (:func:`draftsmith.config.run_settings`) of the enqueuing command; the host's
            come from this worker (:func:`job_settings`).

    Returns:
        The JSON-serialisable result of :func:`extract_shard`, with ``"host"``: the host settings it ran with
        (:func:`host_of`).

    Raises:
        ConfigError: the job's run settings disagree with the run's record; nothing is written (rq records the
            failure, the run's finished shards stay).
        DataError / ModelError: the inputs became invalid since enqueueing (rq records the failure).
        StorageError: the object store failed.
    """
    s = job_settings(run_dir, settings, f"extraction job of shard {shard}")
    setup_logging(s.log_level)
    store = feature_store(run_dir, s.stage_dir)
    side = store.sidecar(shard)  # a shard already stored costs no plan and no pull
    result = (
        _already_stored(shard, side) if side is not None else _extract_and_hand_over(s, store, plan_of(store, s), shard)
    )
    return {**result, "host": host_of(s)}
