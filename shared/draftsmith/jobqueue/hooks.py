"""What a stage asks of the worker pool, registered by the stage so that the queue package imports no stage.

Three moments: once in the pool process before it starts its workers (``at_pool_start``: imports and warm-ups that
every forked worker and work-horse then inherits instead of repeating per job), in a forking worker before
each job's work-horse is forked (``before_job``: caches read once and inherited, given the job's kwargs), and in a
resident worker whose queues have been empty for a while (``when_idle``: what a job loaded, freed for others). A stage
registers in its job module (``draftsmith.generation.jobs``), which the command that starts the pool imports.
A hook that fails is logged and skipped: hooks save time, the job does its work without them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from draftsmith.log import get_logger

log = get_logger(__name__)

_AT_POOL_START: list[Callable[[], None]] = []
_BEFORE_JOB: list[Callable[[dict[str, Any]], None]] = []
_WHEN_IDLE: list[tuple[float, Callable[[float], None]]] = []


def at_pool_start(fn: Callable[[], None]) -> Callable[[], None]:
    """Register ``fn`` to run once in the pool process before its workers start (usable as a decorator)."""
    if fn not in _AT_POOL_START:
        _AT_POOL_START.append(fn)
    return fn


def before_job(fn: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """Register ``fn(job_kwargs)`` to run in a worker before each job's work-horse is forked (a decorator too)."""
    if fn not in _BEFORE_JOB:
        _BEFORE_JOB.append(fn)
    return fn


def when_idle(after_s: float, fn: Callable[[float], None]) -> None:
    """Register ``fn(idle_s)`` to run in a resident worker once its queues have been empty for ``after_s`` seconds
    (once per spell of empty queues; a job ends the spell). Registered in the pool process before its workers
    fork; ``after_s`` <= 0 registers nothing."""
    if after_s > 0 and not any(f is fn for _, f in _WHEN_IDLE):
        _WHEN_IDLE.append((float(after_s), fn))


def idle_hooks() -> list[tuple[float, Callable[[float], None]]]:
    """The ``when_idle`` hooks as ``(after_s, fn)``, soonest first."""
    return sorted(_WHEN_IDLE, key=lambda h: h[0])


def run_idle_hook(fn: Callable[[float], None], idle_s: float) -> None:
    """Run one ``when_idle`` hook (a failure is logged, the worker goes on)."""
    _run(fn, idle_s)


def run_at_pool_start() -> None:
    """Run the ``at_pool_start`` hooks in order."""
    for fn in _AT_POOL_START:
        _run(fn)


def run_before_job(job_kwargs: dict[str, Any] | None) -> None:
    """Run the ``before_job`` hooks with a job's kwargs."""
    for fn in _BEFORE_JOB:
        _run(fn, dict(job_kwargs or {}))


def _run(fn: Callable[..., None], *args: Any) -> None:
    try:
        fn(*args)
    except Exception as e:  # a warm-up only: the job reads and imports what it needs itself
        log.warning("%s skipped (%s: %s); the job does without it", getattr(fn, "__qualname__", fn),
                    type(e).__name__, e)
