"""Live progress of a generation run, shared by every worker through one Redis hash.

Fields: ``phase`` (loading dataset / enqueued / running / done), ``total``, ``done_at_start`` (prompts already on
disk when the run was enqueued), ``started_at`` (first job start), counters ``requests_ok``, ``requests_err``,
``completion_tokens``, ``latency_sum_s``, ``prompts_done`` and ``err:<reason>``. ``status`` turns them into rates.
When Redis lost the hash (a flush), ``status`` falls back to what is on disk.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from draftsmith.artifacts.location import run_key, run_location
from draftsmith.generation.store import load_prompts, record_tally
from draftsmith.jobqueue.inflight import InflightCap


def progress_key(prefix: str, run_root: Path) -> str:
    """Redis key of a run's progress hash (the run folder identifies the run)."""
    return f"{prefix}:progress:{run_key(run_root)}"


class ProgressBoard:
    """Writer side: jobs and ``enqueue`` update the run's hash."""

    def __init__(self, client: redis.Redis, prefix: str, run_root: Path) -> None:
        self.client = client
        self.key = progress_key(prefix, run_root)

    def set(self, **fields: object) -> None:
        self.client.hset(self.key, mapping={k: str(v) for k, v in fields.items()})

    def start_if_unset(self) -> None:
        """Mark the first moment a job ran (rates are measured from here)."""
        if self.client.hsetnx(self.key, "started_at", repr(time.time())):
            self.client.hset(self.key, "phase", "running")

    def incr(self, **counters: float) -> None:
        """Add ``counters`` to the hash now (one Redis round trip)."""
        if not counters:
            return
        pipe = self.client.pipeline()
        for k, v in counters.items():
            if isinstance(v, float):
                pipe.hincrbyfloat(self.key, k, v)
            else:
                pipe.hincrby(self.key, k, int(v))
        pipe.execute()

    def tally(self) -> ProgressTally:
        """A local tally of this board's counters, written by :meth:`ProgressTally.flush` (a job counts each request
        there and flushes with its shard writer: one round trip every few seconds, not one per request)."""
        return ProgressTally(self)

    def reset(self) -> None:
        self.client.delete(self.key)

    def read(self) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.client.hgetall(self.key).items()}


class ProgressTally:
    """Counters kept in the process and added to a :class:`ProgressBoard` in one round trip by :meth:`flush`
    (a Redis transaction per request cost the pool more than the request itself against a fast server).
    Thread-safe: the job's requests count on the event loop, the shard writer flushes from a thread."""

    def __init__(self, board: ProgressBoard) -> None:
        import threading

        self.board = board
        self.pending: dict[str, float] = {}
        self._lock = threading.Lock()

    def incr(self, **counters: float) -> None:
        """Count ``counters`` locally (no Redis)."""
        with self._lock:
            for k, v in counters.items():
                self.pending[k] = self.pending.get(k, 0) + v

    def flush(self) -> None:
        """Add what was counted since the last flush to the board; on a Redis error the counts stay pending.

        Raises:
            redis.RedisError: Redis did not take the counts (they are kept for the next flush).
        """
        with self._lock:
            batch, self.pending = self.pending, {}
        try:
            self.board.incr(**batch)
        except redis.RedisError:
            with self._lock:
                for k, v in batch.items():
                    self.pending[k] = self.pending.get(k, 0) + v
            raise


@dataclass
class ProgressSnapshot:
    """What ``status`` prints: one correct line of the run's progress."""

    phase: str
    total: int
    done: int
    errors: int  # records of permanent errors on disk (part of ``done``)
    cut: int = 0  # answers that stopped at their length limit (finish_reason length; part of ``done``)
    errors_by_reason: dict[str, int] = field(default_factory=dict)  # failed requests, retries included (Redis)
    req_per_s: float | None = None
    out_tok_per_s: float | None = None
    in_flight: int = 0
    mean_latency_s: float | None = None
    mean_completion_tokens: float | None = None
    elapsed_s: float | None = None
    eta_s: float | None = None
    source: str = "redis"

    def line(self) -> str:
        """The operator's progress line."""
        def f(v: float | None, fmt: str) -> str:
            return "-" if v is None else format(v, fmt)

        errs = ", ".join(f"{k}={v}" for k, v in sorted(self.errors_by_reason.items()))
        return (
            f"[{self.phase}] {self.done}/{self.total} done ({self.errors} error records"
            f"{f'; {self.cut} answers cut at their length limit' if self.cut else ''}"
            f"{'; failed requests: ' + errs if errs else ''}), "
            f"{f(self.req_per_s, '.2f')} req/s, {f(self.out_tok_per_s, '.1f')} out tok/s, "
            f"in flight {self.in_flight}, mean latency {f(self.mean_latency_s, '.1f')} s, "
            f"avg completion {f(self.mean_completion_tokens, '.0f')} tokens, elapsed {_hms(self.elapsed_s)}, "
            f"ETA {_hms(self.eta_s)}"
        )


def _hms(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def snapshot(client: redis.Redis | None, prefix: str, run_root: Path) -> ProgressSnapshot:
    """Compute the progress line of a run from Redis, or from disk when Redis has nothing for it.

    ``in_flight`` is the generate stage's live lease count (:class:`~draftsmith.jobqueue.inflight.InflightCap`),
    0 without Redis.
    """
    run_root = run_location(run_root)
    h: dict[str, str] = {}
    in_flight = 0
    if client is not None:
        try:
            h = ProgressBoard(client, prefix, run_root).read()
            in_flight = InflightCap(client, prefix, 1, 0).in_flight_all_targets()
        except redis.RedisError:
            h = {}
    tally = record_tally(run_root / "records")
    done_ids, error_records = tally.ids, tally.errors
    done_disk = len(done_ids)
    if not h:
        total = len(load_prompts(run_root / "prompts.jsonl"))
        phase = "done" if total and done_disk >= total else ("idle" if total else "empty")
        return ProgressSnapshot(phase=phase, total=total, done=done_disk, errors=error_records, source="disk",
                                in_flight=in_flight, cut=tally.cut)
    total = int(h.get("total", 0))
    errors = {k[4:]: int(v) for k, v in h.items() if k.startswith("err:")}
    ok = int(h.get("requests_ok", 0))
    lat = float(h.get("latency_sum_s", 0.0))
    tokens = int(h.get("completion_tokens", 0))
    started = float(h["started_at"]) if "started_at" in h else None
    now = time.time()
    if total and done_disk >= total and "last_result_at" in h:
        now = float(h["last_result_at"])  # a finished run's rates and elapsed time stop with its last record
    elapsed = now - started if started else None
    done_since = max(0, done_disk - int(h.get("done_at_start", 0)))
    req_s = ok / elapsed if elapsed and elapsed > 0 else None
    tok_s = tokens / elapsed if elapsed and elapsed > 0 else None
    prompts_s = done_since / elapsed if elapsed and elapsed > 0 and done_since else None
    remaining = max(0, total - done_disk)
    eta = remaining / prompts_s if prompts_s else (0.0 if remaining == 0 and total else None)
    phase = h.get("phase", "running")
    if total and done_disk >= total:
        phase = "done"
    return ProgressSnapshot(
        phase=phase, total=total, done=done_disk, errors=error_records, errors_by_reason=errors, cut=tally.cut,
        req_per_s=req_s, out_tok_per_s=tok_s, in_flight=in_flight,
        mean_latency_s=lat / ok if ok else None, mean_completion_tokens=tokens / ok if ok else None,
        elapsed_s=elapsed, eta_s=eta,
    )
