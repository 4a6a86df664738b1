"""``enqueue``: extract unique prompts, skip what is done or already queued, enqueue the rest as rq jobs.

Everything pending is derived from disk (``prompts.jsonl`` and the record shards), so running ``enqueue`` again
after a Redis flush or a crash rebuilds the queue and loses nothing. Job ids are a hash of the run folder and the
batch's prompt ids: enqueueing twice creates no duplicate work. An existing job id is not trusted: a job whose
worker is gone (killed after it dequeued or started the job) is requeued at once
(:mod:`draftsmith.jobqueue.liveness`), so a resume never waits on rq's maintenance.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rq import Retry

from draftsmith.artifacts.location import run_key
from draftsmith.artifacts.run_settings import record
from draftsmith.artifacts.storage import atomic_write_text, check_disk
from draftsmith.config import Settings, adopt_recorded, run_settings
from draftsmith.generation.job_ids import JOB_FUNC, RESULT_TTL_S, RUN_SECTIONS, job_id_for
from draftsmith.generation.progress import ProgressBoard
from draftsmith.generation.sources import extract_prompts
from draftsmith.generation.store import done_ids, load_prompts, rebuild_manifest, sweep_records
from draftsmith.generation.tail import enqueue_tail, tail_ids
from draftsmith.jobqueue.liveness import ALIVE, JobState, census, requeue_orphan, settle
from draftsmith.jobqueue.queues import connect, fetch_job, get_queue
from draftsmith.log import get_logger
from draftsmith.paths import RunPaths
from draftsmith.target.defaults import (
    apply_generation_defaults,
    generation_job_timeout_s,
    job_timeout_warning,
    target_folder_or_none,
)
from draftsmith.target.server import resolve_model, served_context

log = get_logger(__name__)


@dataclass
class EnqueueReport:
    """What ``enqueue`` did (or would do, with ``dry_run``)."""

    extracted: int = 0
    new_prompts: int = 0
    total: int = 0
    done: int = 0
    queued_already: int = 0
    requeued: int = 0
    pending: int = 0
    jobs: list[str] = field(default_factory=list)
    skipped_rows: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0
    model: str | None = None
    queue: str | None = None


def job_settings(s: Settings) -> dict[str, Any]:
    """The settings a generation job carries: the run's part only (:func:`draftsmith.config.run_settings`: answer
    length, sampling, batch size, served model name), as JSON. The host's part (target URL and API key, Redis,
    concurrency, timeouts, retries, paths) comes from the worker's own environment, so no secret travels in a job
    (rq keeps job kwargs in Redis for days, and Redis may persist them to disk)."""
    return run_settings(s)


def of_run(run_root: Path) -> Callable[[Any], bool]:
    """Predicate: the job belongs to the run at ``run_root`` (its ``run_root`` keyword argument)."""
    want = run_key(run_root)
    return lambda job: run_key((job.kwargs or {}).get("run_root", "")) == want


def prompt_ids(jobs: Iterable[Any]) -> set[str]:
    """The prompts that generation ``jobs`` hold (their ``prompt_ids`` keyword arguments), as one set."""
    out: set[str] = set()
    for job in jobs:
        out.update((job.kwargs or {}).get("prompt_ids", []))
    return out


def active_prompt_ids(queue, run_root: Path) -> set[str]:
    """Prompt ids held by this run's jobs that are alive: waiting, running on a live worker, just dequeued, or
    scheduled for a retry (:func:`draftsmith.jobqueue.liveness.census`), and those on the run's tail list
    (:func:`draftsmith.generation.tail.tail_ids`); a dead worker's job is not counted."""
    jobs = census(queue, keep=of_run(run_root))
    prefix = queue.name.rsplit(":", 1)[0]  # the queue is ``<prefix>:generate`` (queues.queue_name)
    return prompt_ids(job for state, job in jobs.jobs.values() if state in ALIVE) | tail_ids(
        queue.connection, prefix, run_root)


# Characters per token of the estimate below: English prose runs at about 4 with the tokenizers of these
# targets; 3 errs towards warning (code, other scripts and numbers take more tokens per character).
CHARS_PER_TOKEN = 3


def warn_context(s: Settings, model: str, prompts: list[dict], say) -> int:
    """Warn (one line through ``say``) when prompt + ``generation.max_tokens`` may exceed the server's context:
    such a request is refused (a permanent ``context_length`` error record) or its answer is cut (``finish_reason:
    length``, counted apart by ``status``). Prompt tokens are estimated from characters (:data:`CHARS_PER_TOKEN`);
    the server's context is its ``max_model_len`` (:func:`~draftsmith.target.server.served_context`).

    Returns:
        How many of ``prompts`` may not fit (0 when the server does not report its context).
    """
    ctx = served_context(s.target.url, model, s.target.api_key)
    if not ctx or not prompts:
        return 0
    answer = s.generation.max_tokens
    longest = 0
    risky = 0
    for p in prompts:
        chars = sum(len(str(m.get("content") or "")) for m in p.get("messages") or [])
        est = chars // CHARS_PER_TOKEN + 16  # + the chat template's own tokens
        longest = max(longest, est)
        risky += est + answer > ctx
    if answer >= ctx:
        say(f"Warning: generation.max_tokens {answer} >= the server's context ({ctx} tokens, max_model_len): every "
            "answer that long is refused or cut. Start the target with a longer context (MAX_MODEL_LEN, "
            "target.max_model_len) or lower generation.max_tokens")
    elif risky:
        say(f"Warning: {risky} of {len(prompts)} prompts may not fit the server's context: about {longest} prompt "
            f"tokens + generation.max_tokens {answer} > max_model_len {ctx}. Their answers are cut (status counts "
            "them) or refused (context_length error records). Raise MAX_MODEL_LEN (target.max_model_len) or lower "
            "generation.max_tokens")
    return risky


def enqueue(s: Settings, source: str | None, limit: int | None, batch_size: int, dry_run: bool = False,
            split: str = "train", say: Callable[[str], None] = print, sample_seed: int | None = 0) -> EnqueueReport:
    """Extract prompts from ``source`` into the run and enqueue what is pending.

    ``limit`` prompts are a seeded sample over the whole source (``sample_seed``; the same seed draws the same
    prompts, so enqueueing again adds none), or its first ``limit`` unique prompts in file order with
    ``sample_seed`` None (:func:`~draftsmith.generation.sources.extract_prompts`).

    ``source`` None re-enqueues the run's existing ``prompts.jsonl`` (resume after a crash or a Redis flush).
    Generation keys the config leaves unset take the target's defaults first
    (:func:`~draftsmith.target.defaults.apply_generation_defaults`: its recommended sampling, a request timeout for
    the lengths), each said through ``say``; ``s`` is changed in place.

    Raises:
        SourceError, TargetUnavailable, ModelNotServed, DiskSpaceError, QueueError: see their messages.
    """
    paths = RunPaths(s.runs_dir, s.run)
    s, adopted = adopt_recorded(s, paths.root, RUN_SECTIONS)
    if adopted:
        say("Continuing with the run's recorded " + ", ".join(
            f"{k}={getattr(getattr(s, k.split('.')[0]), k.split('.')[1])!r}" for k in adopted)
            + " (set them to change the run)")
        if "generation.batch_size" in adopted:
            batch_size = s.generation.batch_size
    report = EnqueueReport()
    for line in apply_generation_defaults(s, target_folder_or_none(s)):  # the jobs carry the run keys taken
        say(f"Default {line}")
    if warning := job_timeout_warning(s.generation):
        say(f"Warning: {warning}")
    existing = load_prompts(paths.prompts)
    client = board = None
    if not dry_run:
        paths.ensure()
        client = connect(s.redis.url)
        board = ProgressBoard(client, s.redis.prefix, paths.root)
        if not board.read().get("started_at"):
            board.set(phase="loading dataset")  # `status` shows it from the first second of the run
    batch_prompts = _source_prompts(s, source, limit, split, existing, paths, report, say, sample_seed)
    if not dry_run:
        _tidy_records(paths, say)
    done = done_ids(paths.records)
    wanted = [i for i in batch_prompts if i not in done]
    if dry_run:
        report.total, report.done, report.pending = len(batch_prompts), len(batch_prompts) - len(wanted), len(wanted)
        say(f"Pending: {report.pending} (skipping {report.done} already done)")
        say("Dry run: nothing enqueued")
        return report
    check_disk(paths.root, s.generation.min_free_disk_gb)
    model = resolve_model(s.target.url, s.target.model, s.target.api_key)
    report.model = model
    warn_context(s, model, [batch_prompts[i] for i in wanted], say)
    paths.ensure(paths.records)
    if source and report.new_prompts:
        merged = {**existing, **{k: v for k, v in batch_prompts.items() if k not in existing}}
        atomic_write_text(paths.prompts, "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in merged.values()))
        existing = merged
    queue = get_queue(client, s.redis.prefix, "generate")
    report.queue = queue.name
    jobs = settle(queue, keep=of_run(paths.root))
    active = _active_prompts(queue, jobs, client, s.redis.prefix, paths, report, say)
    pending = [i for i in wanted if i not in active]
    report.total = len(existing)
    report.done = len(done & set(existing))
    report.queued_already = len([i for i in wanted if i in active])
    report.pending = len(pending)
    say(f"Pending: {len(pending)} (skipping {len(batch_prompts) - len(wanted)} already done"
        + (f", {report.queued_already} already queued)" if report.queued_already else ")"))
    if not active:
        board.reset()
    board.set(phase="enqueued" if pending or active else "done", total=report.total, done_at_start=report.done)
    _submit(s, queue, jobs, client, paths, pending, batch_size, model, report)
    say(f"Enqueued {len(report.jobs)} jobs of up to {batch_size} prompts on queue {queue.name} (model {model})")
    return report


def _source_prompts(s: Settings, source: str | None, limit: int | None, split: str, existing: dict[str, dict],
                    paths: RunPaths, report: EnqueueReport, say: Callable[[str], None],
                    sample_seed: int | None = 0) -> dict[str, dict]:
    """The prompts of this enqueue, by id: extracted from ``source`` (counted in ``report``), or the run's own
    ``prompts.jsonl`` when ``source`` is None (a resume)."""
    if not source:
        report.extracted = len(existing)
        say(f"Resuming {len(existing)} prompts from {paths.prompts}")
        return existing
    say(f"Loading dataset {source}...")
    result = extract_prompts(source, limit, split, s.generation.system_prompt, sample_seed)
    report.extracted, report.duplicates = len(result.prompts), result.duplicates
    report.skipped_rows = dict(result.skipped)
    say(f"Extracted {report.extracted} unique questions")
    if limit is not None and result.unique > limit:
        say(f"  a seeded sample (seed {sample_seed}) of the source's {result.unique} unique questions; "
            "--file-order takes the first ones" if sample_seed is not None else
            f"  the first {limit} in file order, of more in the source")
    if result.skipped:
        say("Skipped rows: " + ", ".join(f"{k}={v}" for k, v in sorted(result.skipped.items())))
    report.new_prompts = len([p for p in result.prompts if p.id not in existing])
    return {p.id: p.to_json() for p in result.prompts}


def _tidy_records(paths: RunPaths, say: Callable[[str], None]) -> None:
    """Remove what interrupted writes left in the records folder and rebuild its manifest from the shards."""
    swept = sweep_records(paths.records)
    if any(swept.values()):
        say(f"Removed leftovers of interrupted writes: {swept['temp_files']} temporary file(s), "
            f"{swept['orphan_shards']} shard(s) without sidecar")
    if paths.records.is_dir():
        rebuild_manifest(paths.records)


def _active_prompts(queue, jobs, client, prefix: str, paths: RunPaths, report: EnqueueReport,
                    say: Callable[[str], None]) -> set[str]:
    """Ids of the prompts some job will still answer: the queued and running jobs', the orphans' (requeued here:
    their worker is gone), and the prompts handed off to a tail job."""
    orphans = jobs.of(JobState.ORPHANED)
    for job in orphans:
        requeue_orphan(queue, job)
    if orphans:
        report.requeued = len(orphans)
        say(f"Requeued {len(orphans)} job(s) of {len(prompt_ids(orphans))} prompts whose worker is gone "
            "(killed after it took them)")
    active = prompt_ids(orphans) | prompt_ids(job for state, job in jobs.jobs.values() if state in ALIVE)
    return active | tail_ids(client, prefix, paths.root)  # handed off: a tail job answers them


def _submit(s: Settings, queue, jobs, client, paths: RunPaths, pending: list[str], batch_size: int, model: str,
            report: EnqueueReport) -> None:
    """Enqueue ``pending`` in jobs of ``batch_size`` prompts (a job id per prompt set, so a second enqueue finds
    its job), then the tail jobs whose prompts no job answers any more; their ids go to ``report.jobs``."""
    settings_json = job_settings(s)
    if changed := record(paths.root, settings_json, RUN_SECTIONS):
        log.warning("the run's settings change (%s): jobs still queued with the old values will be refused",
                    "; ".join(changed))
    # rq's Retry refuses max=0: no retry object at all means "fail for good on the first failure"
    n_retries = s.generation.job_retries
    retry = Retry(max=n_retries, interval=[5, 30, 120][:n_retries]) if n_retries > 0 else None
    job_timeout = generation_job_timeout_s(s.generation)  # never shorter than one request's retries, unless set
    for start in range(0, len(pending), batch_size):
        ids = pending[start : start + batch_size]
        jid = job_id_for(paths.root, ids)
        old = fetch_job(client, jid)
        if old is not None:
            if jid in jobs.jobs and jobs.jobs[jid][0] in ALIVE:
                continue
            old.delete()  # finished, failed for good, or gone with its worker: its pending prompts run again
        queue.enqueue(
            JOB_FUNC, job_id=jid, retry=retry, job_timeout=job_timeout, result_ttl=RESULT_TTL_S,
            failure_ttl=30 * 86400, description=f"generate {len(ids)} prompts for {paths.run}",
            kwargs={"run_root": run_key(paths.root), "job_id": jid, "prompt_ids": ids, "model": model,
                    "settings": settings_json},
        )
        report.jobs.append(jid)
    # handed-off prompts whose tail job was never enqueued (the jobs that would have ended are gone)
    report.jobs += enqueue_tail(queue, paths.root, s.redis.prefix, batch_size, model, settings_json, False,
                                job_retries=n_retries, job_timeout_s=job_timeout)
