"""Why a generation run is not progressing: rq's failed and started registries, the queue, the age of the last
result and the free disk, turned into one verdict for ``draftsmith status``.

The progress hash alone (:mod:`draftsmith.generation.progress`) says ``running`` and an ETA as long as prompts are
missing, even when every remaining job failed for good, when leaked leases or dead workers stall the pool, or when
the disk is full. :func:`diagnose` reads what rq knows and says ``failed`` / ``stalled`` with the reason and the fix.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

STALL_MIN_S = 300.0  # no new record for this long (or 10 mean request latencies, if longer) while work is pending


@dataclass
class QueueHealth:
    """What rq holds for one run: jobs queued, started and failed for good (with their prompts and last errors)."""

    queued: int = 0
    started: int = 0
    failed_jobs: int = 0
    failed_prompts: int = 0
    reasons: Counter = field(default_factory=Counter)


@dataclass
class Verdict:
    """A phase that replaces ``running`` (``failed`` or ``stalled``), why, and what to do."""

    phase: str
    reason: str
    fix: str

    def line(self) -> str:
        return f"{self.reason} -> {self.fix}"


def _last_error_line(job) -> str:
    """The last line of a failed job's traceback (``OSError: [Errno 28] No space left on device``)."""
    text = ""
    try:
        res = job.latest_result()
        text = (res.exc_string if res is not None else "") or ""
    except Exception:  # an rq version or a result without exc_string: fall back to exc_info
        text = ""
    text = text or (getattr(job, "exc_info", None) or "")
    lines = [x.strip() for x in str(text).strip().splitlines() if x.strip()]
    return (lines[-1] if lines else "unknown error")[:200]


def queue_health(client, prefix: str, run_root: Path) -> QueueHealth:
    """Read the generation queue's registries for the jobs of the run at ``run_root``.

    Raises:
        redis.RedisError: Redis stopped answering while reading.
    """
    from rq.registry import FailedJobRegistry, StartedJobRegistry
    from rq.serializers import JSONSerializer

    from draftsmith.jobqueue.queues import fetch_job, get_queue

    q = get_queue(client, prefix, "generate")
    want = str(Path(run_root).resolve())
    out = QueueHealth()

    def mine(jid: str):
        job = fetch_job(client, jid)
        if job is None:
            return None
        kw = job.kwargs or {}
        return job if str(Path(kw.get("run_root", "")).resolve()) == want else None

    out.queued = sum(1 for jid in q.get_job_ids() if mine(jid) is not None)
    started = StartedJobRegistry(q.name, connection=client, serializer=JSONSerializer)
    out.started = sum(1 for jid in started.get_job_ids(cleanup=False) if mine(jid) is not None)
    failed = FailedJobRegistry(q.name, connection=client, serializer=JSONSerializer)
    for jid in failed.get_job_ids(cleanup=False):
        job = mine(jid)
        if job is None:
            continue
        out.failed_jobs += 1
        out.failed_prompts += len((job.kwargs or {}).get("prompt_ids", []))
        out.reasons[_last_error_line(job)] += 1
    return out


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
    probe = Path(run_root)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free_gb = shutil.disk_usage(probe).free / 1e9
    if free_gb < min_free_gb:
        return Verdict("stalled", f"disk full: {free_gb:.2f} GB free under {run_root} (generation.min_free_disk_gb "
                       f"= {min_free_gb}), {missing} prompts without a record",
                       f"free some space or move runs_dir to a bigger disk, then {again}")
    if health is None:
        return None
    pending = health.queued + health.started
    if health.failed_jobs and not pending:
        top = ", ".join(f"{r} ({n} jobs)" if n > 1 else r for r, n in health.reasons.most_common(2))
        return Verdict("failed", f"{health.failed_prompts} prompts in {health.failed_jobs} jobs failed for good: "
                       f"{top}; nothing is queued or running", f"fix the cause, then {again}")
    last = max((float(progress[k]) for k in ("last_result_at", "started_at") if k in progress), default=None)
    if pending and last is not None:
        stall_s = max(STALL_MIN_S, 10 * (snap.mean_latency_s or 0.0))
        age = now - last
        if age > stall_s:
            return Verdict("stalled", f"no new record for {age:.0f} s with {health.started} jobs started and "
                           f"{health.queued} queued ({health.failed_jobs} failed for good)",
                           "check that workers run (`draftsmith worker`) and the target answers; jobs of dead "
                           "workers go back to the queue when rq's job timeout expires")
    if not pending and not health.failed_jobs and progress:
        return Verdict("stalled", f"{missing} prompts without a record and no job queued or running",
                       f"{again}")
    return None
