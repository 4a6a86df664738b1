"""Why a generation run is not progressing: rq's failed and started registries, the queue, the age of the last
result and the free disk, turned into one verdict for ``draftsmith status``.

The progress hash alone (:mod:`draftsmith.generation.progress`) says ``running`` and an ETA as long as prompts are
missing, even when every remaining job failed for good, when leaked leases or dead workers stall the pool, or when
the disk is full. :func:`diagnose` reads what rq knows and says ``failed`` / ``stalled`` with the reason and the fix.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftsmith.artifacts.location import run_key, run_location
from draftsmith.artifacts.storage import free_gb as disk_free_gb
from draftsmith.generation.enqueue import of_run
from draftsmith.generation.store import done_ids, load_prompts
from draftsmith.generation.tail import tail_ids
from draftsmith.jobqueue.liveness import JobState, census
from draftsmith.jobqueue.queues import get_queue

STALL_MIN_S = 300.0  # no new record for this long (or 10 mean request latencies, if longer) while work is pending


@dataclass
class QueueHealth:
    """Where the run's prompts without a record are, by the state of the job holding them
    (:class:`~draftsmith.jobqueue.liveness.JobState`), counted from the same sources as the records: the run's
    ``prompts.jsonl``, the record shards' sidecars (done) and rq's queue and registries (jobs).

    A prompt held by several jobs counts once, in its liveliest job; ``unassigned`` prompts are in no job at all.
    ``failed_jobs`` / ``reasons`` describe the failed jobs that still hold a prompt without a record.
    """

    total: int = 0
    done: int = 0
    waiting: int = 0
    dequeued: int = 0
    running: int = 0
    retry: int = 0
    orphaned: int = 0
    failed: int = 0
    unassigned: int = 0
    tail: int = 0  # handed off by a batch job, waiting on the run's tail list for a tail job
    jobs: Counter = field(default_factory=Counter)  # JobState value -> jobs holding a missing prompt
    failed_jobs: int = 0
    reasons: Counter = field(default_factory=Counter)

    @property
    def missing(self) -> int:
        """Prompts without a record."""
        return self.total - self.done

    @property
    def pending(self) -> int:
        """Prompts that a live job will still answer (waiting, dequeued, running or scheduled for a retry)."""
        return self.waiting + self.dequeued + self.running + self.retry + self.tail

    def line(self) -> str:
        """``missing 12: 8 queued, 3 running, 1 failed for good``; empty when nothing is missing."""
        if not self.missing:
            return ""
        parts = [f"{n} {label}" for n, label in (
            (self.waiting, "queued"), (self.tail, "handed off to the tail"), (self.dequeued, "being started"),
            (self.running, "running"),
            (self.retry, "to be retried"), (self.orphaned, "held by a worker that is gone"),
            (self.failed, "failed for good"), (self.unassigned, "in no job")) if n]
        return f"missing {self.missing}: " + ", ".join(parts)


@dataclass
class Verdict:
    """A phase that replaces ``running`` (``failed`` or ``stalled``), why, and what to do."""

    phase: str
    reason: str
    fix: str

    def line(self) -> str:
        return f"{self.reason} -> {self.fix}"


def _last_error_line(job, limit: int = 200) -> str:
    """The last line of a failed job's traceback (``OSError: [Errno 28] No space left on device``), at most
    ``limit`` characters."""
    text = ""
    try:
        res = job.latest_result()
        text = (res.exc_string if res is not None else "") or ""
    except Exception:  # an rq version or a result without exc_string: fall back to exc_info
        text = ""
    text = text or (getattr(job, "exc_info", None) or "")
    lines = [x.strip() for x in str(text).strip().splitlines() if x.strip()]
    return (lines[-1] if lines else "unknown error")[:limit]


def queue_health(client, prefix: str, run_root: Path) -> QueueHealth:
    """Count where the run's prompts without a record are (:class:`QueueHealth`).

    Raises:
        redis.RedisError: Redis stopped answering while reading.
        DataError: a shard sidecar is unreadable.
    """
    root = run_location(run_root)
    prompts = set(load_prompts(root / "prompts.jsonl"))
    done = done_ids(root / "records") & prompts
    missing = prompts - done
    out = QueueHealth(total=len(prompts), done=len(done))
    tail = missing & tail_ids(client, prefix, root)  # counted there, not in the job that handed them off
    out.tail, missing = len(tail), missing - tail
    jobs = census(get_queue(client, prefix, "generate"), keep=of_run(root))
    order = (JobState.RUNNING, JobState.DEQUEUED, JobState.WAITING, JobState.RETRY, JobState.ORPHANED,
             JobState.FAILED)
    for state in order:
        for job in jobs.of(state):
            held = missing.intersection((job.kwargs or {}).get("prompt_ids", []))
            if not held:
                continue
            missing -= held
            setattr(out, state.value, getattr(out, state.value) + len(held))
            out.jobs[state.value] += 1
            if state is JobState.FAILED:
                out.failed_jobs += 1
                out.reasons[_last_error_line(job)] += 1
    out.unassigned = len(missing)
    return out


def extraction_failures(client, prefix: str, run_root: Any) -> list[tuple[int, str]]:
    """The run's extraction jobs that failed for good (rq's failed registry of ``<prefix>:extract``: a job refused
    for its run settings, :class:`~draftsmith.errors.RunSettingsMismatch`, or one out of retries), as
    ``[(shard, last error line)]`` by shard. A shard enqueued again has a new job, so a listed one is still undone.

    Raises:
        redis.RedisError: Redis stopped answering while reading.
    """
    want = run_key(run_root)

    def of_run(job) -> bool:
        args = job.args or ()
        return bool(args) and run_key(args[0]) == want

    jobs = census(get_queue(client, prefix, "extract"), keep=of_run)
    # the whole line: a refusal names every disagreeing key with both values, and the fix
    return sorted((int(job.args[1]), _last_error_line(job, limit=2000)) for job in jobs.of(JobState.FAILED))


def extraction_line(client, prefix: str, run_root: Any, run: str) -> str | None:
    """``draftsmith status``'s line for the run's extraction jobs that failed for good (:func:`extraction_failures`),
    the reason of the last one and what to do; None when there are none.

    Raises:
        redis.RedisError: Redis stopped answering while reading.
    """
    failed = extraction_failures(client, prefix, run_root)
    if not failed:
        return None
    shards = ", ".join(str(i) for i, _ in failed[:8]) + (" ..." if len(failed) > 8 else "")
    reasons = Counter(reason for _, reason in failed)
    reason, n = reasons.most_common(1)[0]
    more = f" ({n} of them; {len(reasons) - 1} other reason(s))" if len(reasons) > 1 else ""
    return (f"extraction queue: {len(failed)} job(s) failed for good, shard(s) {shards}: {reason}{more} "
            f"| they stay in rq's failed registry; `draftsmith extract --run {run}` enqueues their shards again")


def diagnose(snap, health: QueueHealth | None, progress: dict[str, str], run_root: Path, run: str,
             min_free_gb: float, now: float | None = None) -> Verdict | None:
    """The verdict for a run that is not done, or None when it is progressing (or done).

    Args:
        snap: the run's :class:`~draftsmith.generation.progress.ProgressSnapshot`.
        health: :func:`queue_health` (None when Redis did not answer).
        progress: the run's progress hash (``started_at``, ``last_result_at``).
        min_free_gb: ``generation.min_free_disk_gb``.
    """
    if snap.phase == "done" or not snap.total or snap.done >= snap.total:
        return None
    now = time.time() if now is None else now
    missing = snap.total - snap.done
    again = f"`draftsmith enqueue --run {run}` re-enqueues every prompt without a record"
    free_gb = disk_free_gb(run_root)
    if free_gb < min_free_gb:
        return Verdict("stalled", f"disk full: {free_gb:.2f} GB free under {run_root} (generation.min_free_disk_gb "
                       f"= {min_free_gb}), {missing} prompts without a record",
                       f"free some space or move runs_dir to a bigger disk, then {again}")
    if health is None:
        return None
    if health.failed and not health.pending:
        top = ", ".join(f"{r} ({n} jobs)" if n > 1 else r for r, n in health.reasons.most_common(2))
        more = (f"; {health.orphaned + health.unassigned} more in no live job" if health.orphaned
                or health.unassigned else "")
        return Verdict("failed", f"{health.failed} prompts failed for good in {health.failed_jobs} jobs: {top}; "
                       f"nothing is queued or running{more}", f"fix the cause, then {again}")
    if (health.orphaned or health.unassigned) and not health.pending:
        return Verdict("stalled", f"{health.line()}; no job is queued or running",
                       f"{again} (a job whose worker is gone is requeued)")
    last = max((float(progress[k]) for k in ("last_result_at", "started_at") if k in progress), default=None)
    if health.pending and last is not None:
        stall_s = max(STALL_MIN_S, 10 * (snap.mean_latency_s or 0.0))
        age = now - last
        if age > stall_s:
            return Verdict("stalled", f"no new record for {age:.0f} s; {health.line()}",
                           "check that workers run (`draftsmith worker`) and the target answers"
                           + (f"; {again}" if health.orphaned or health.unassigned else ""))
    return None
