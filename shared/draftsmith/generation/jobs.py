"""The generation job: one batch of prompts in, one record shard out. Runs inside an rq work-horse.

A job sends its prompts to the target concurrently (asyncio), each request holding a lease of the shared in-flight
cap. Multi-turn prompts regenerate every assistant turn in order, each turn seeing the target's own earlier
answers. Permanent errors (context length, other 4xx) become records with ``status: error``; prompts that still
fail transiently after the client's retries are left out of the shard and the job raises at the end, so rq's
Retry runs it again for those prompts only (the rest are on disk and skipped). A request of a batch job that runs
longer than ``generation.handoff_after_s`` is cancelled and its prompt handed to the run's tail
(:mod:`draftsmith.generation.tail`), so one long answer does not hold the job's process; with streamed answers (the
default) the bound counts from the answer's first token, not from the time the request waited in the engine.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
from pathlib import Path
from typing import Any

from draftsmith.artifacts.location import run_location
from draftsmith.artifacts.records import RECORD_SCHEMA
from draftsmith.artifacts.run_settings import check_job
from draftsmith.config import Settings, run_settings, secret_value, settings_for_job
from draftsmith.errors import DiskSpaceError, TargetUnavailable, TransientFailures
from draftsmith.generation.client import ChatClient, ChatError, token_id_request, warm_http
from draftsmith.generation.job_ids import RUN_SECTIONS
from draftsmith.generation.progress import ProgressBoard, ProgressTally
from draftsmith.generation.runcache import done_index, prompt_index, warm
from draftsmith.generation.store import write_shard
from draftsmith.generation.tail import enqueue_tail, hand_off, handed_off
from draftsmith.jobqueue.hooks import at_pool_start, before_job
from draftsmith.jobqueue.inflight import InflightCap, LeaseBroker
from draftsmith.jobqueue.queues import connect, get_queue
from draftsmith.log import get_logger
from draftsmith.target.defaults import derived_request_timeout_s, generation_job_timeout_s, retry_budget_s
from draftsmith.target.server import served_engine

log = get_logger(__name__)

# the worker pool's warm-ups for generation jobs (draftsmith.jobqueue.hooks): the TLS context and lazy imports once in
# the pool process, the run's prompt and done indexes once per job in the worker; every work-horse inherits both
at_pool_start(warm_http)


@before_job
def warm_run_caches(job_kwargs: dict[str, Any]) -> None:
    """Read the prompt and done indexes of the job's run (``run_root`` in its kwargs) into this process's caches."""
    warm(job_kwargs.get("run_root") or "")

API_KEY_ENV = "DRAFTSMITH_TARGET__API_KEY"
URL_ENV = "DRAFTSMITH_TARGET__URL"


class Straggler(Exception):
    """A request of the prompt outlived the job's hand-off bound and was cancelled (its partial answer is gone)."""


def sampling_params(s: Settings) -> dict[str, Any]:
    """The sampling part of a chat request body (also stored in every record)."""
    g = s.generation
    body: dict[str, Any] = {"temperature": g.temperature, "top_p": g.top_p, "max_tokens": g.max_tokens}
    if g.top_k is not None:
        body["top_k"] = g.top_k
    if g.seed is not None:
        body["seed"] = g.seed
    return body


async def _answer(prompt: dict[str, Any], client: ChatClient, cap: LeaseBroker, board: ProgressTally,
                  s: Settings, run: str, handoff_s: float = 0.0) -> dict[str, Any] | None:
    """Regenerate every assistant turn of one prompt; None when a transient error outlived the retries.

    Raises:
        Straggler: one attempt ran longer than ``handoff_s`` seconds (0 = no bound); the attempt was cancelled.
    """
    from draftsmith import metrics as M

    record: dict[str, Any] = {"schema": RECORD_SCHEMA, "id": prompt["id"], "status": "ok", "error": None,
                              "model": client.model}
    token: list[str] = []
    # the bound runs from the attempt's first token (streamed) or, unstreamed, from its lease: time spent waiting
    # for a lease, backing off or (streamed) queued inside the engine never counts; at a concurrency above what the
    # server's KV cache holds, most of a long answer's time before its first token is that queue
    bound = asyncio.timeout(None)

    def start_bound() -> None:
        if handoff_s:
            bound.reschedule(asyncio.get_running_loop().time() + handoff_s)

    async def before() -> None:
        token.append(await cap.acquire())
        M.GEN_INFLIGHT.labels(run).inc()
        if not client.stream:
            start_bound()

    async def after() -> None:
        if handoff_s and not bound.expired():
            bound.reschedule(None)
        M.GEN_INFLIGHT.labels(run).dec()
        if token:
            cap.release(token.pop())

    try:
        async with bound:
            return await _turns(prompt, client, board, s, run, before, after, record, start_bound)
    except TimeoutError:
        if bound.expired():
            raise Straggler(prompt["id"]) from None
        raise


async def _turns(prompt: dict[str, Any], client: ChatClient, board: ProgressTally, s: Settings, run: str,
                 before, after, record: dict[str, Any], first_token=None) -> dict[str, Any] | None:
    """The turns of :func:`_answer`, each request wrapped by ``before``/``after`` (``first_token`` runs at each
    streamed attempt's first chunk); None on a transient failure."""
    from draftsmith import metrics as M

    sampling = sampling_params(s)
    messages: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []

    for msg in prompt["messages"]:
        messages.append(dict(msg))
        if msg["role"] != "user":
            continue
        # the conversation so far, without reasoning (servers drop it from history)
        history = [{"role": m["role"], "content": m["content"]} for m in messages]
        try:
            res = await client.chat(history, sampling, before, after, first_token)
        except ChatError as e:
            M.GEN_REQUESTS.labels(run, e.reason).inc()
            if e.transient:
                return None
            board.incr(**{"prompts_error": 1})
            record.update(status="error", error={"reason": e.reason, "message": e.message[:500], "turn": len(turns)})
            break  # the record keeps the user turn that could not be answered
        M.GEN_REQUESTS.labels(run, "ok").inc()
        M.GEN_LATENCY.labels(run).observe(res.latency_s)
        M.GEN_COMPLETION_TOKENS.labels(run).inc(res.usage.get("completion_tokens", 0))
        M.GEN_PROMPT_TOKENS.labels(run).inc(res.usage.get("prompt_tokens", 0))
        board.incr(requests_ok=1, completion_tokens=res.usage.get("completion_tokens", 0),
                   latency_sum_s=float(res.latency_s))
        record["model"] = res.model or client.model
        messages.append({"role": "assistant", "content": res.content, "reasoning": res.reasoning})
        turns.append({"finish_reason": res.finish_reason, "usage": res.usage, "token_ids": res.token_ids,
                      "prompt_token_ids": res.prompt_token_ids,
                      "reasoning_field": res.reasoning_field, "latency_s": round(res.latency_s, 4)})
    record.update(messages=messages, turns=turns, sampling=sampling)
    return record


class ShardWriter:
    """Writes a job's finished records as they complete: every ``flush_s`` seconds and once more when the job ends
    (normally, on an error, or on rq's job timeout), so finished answers are never lost with the batch.

    Raises (from :meth:`flush`):
        DiskSpaceError: the disk is full; the answers not written are counted in the message (they are
        regenerated when the job runs again).
    """

    def __init__(self, records_dir: Path, job_id: str, flush_s: float = 5.0) -> None:
        self.records_dir, self.job_id, self.flush_s = records_dir, job_id, flush_s
        self.pending: list[dict[str, Any]] = []
        self.written = self.dropped = 0
        self.shards: list[str] = []
        self._lock = threading.Lock()

    def add(self, record: dict[str, Any]) -> None:
        """Queue one finished record (stamped with the job id and the time) for the next :meth:`flush`."""
        record["job_id"] = self.job_id
        record["created_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with self._lock:
            self.pending.append(record)

    def flush(self) -> int:
        """Write what is pending as one shard; returns the number of records written."""
        with self._lock:
            batch, self.pending = self.pending, []
        if not batch:
            return 0
        try:
            shard, dropped = write_shard(self.records_dir, self.job_id, batch)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            raise DiskSpaceError(
                f"disk full under {self.records_dir}: {len(batch)} finished answer(s) of job {self.job_id} could "
                "not be written (they will be generated again)",
                "free some space, then start the worker again (or re-run `draftsmith enqueue`)",
            ) from None
        self.written += len(batch) - dropped
        self.dropped += dropped
        if shard is not None:
            self.shards.append(shard.name)
        return len(batch) - dropped

    async def keep_flushing(self) -> None:
        """Flush every ``flush_s`` seconds until cancelled."""
        while True:
            await asyncio.sleep(self.flush_s)
            await asyncio.to_thread(self.flush)


async def _engine(url: str, model: str, api_key: str | None) -> str | None:
    """The engine serving ``model`` (:func:`draftsmith.target.server.served_engine`), said once in the log when it
    costs the stream; None when the server cannot be asked (the requests then say why)."""
    try:
        engine = await asyncio.to_thread(served_engine, url, model, api_key)
    except TargetUnavailable:
        return None
    if engine == "sglang":
        log.info("target %s is SGLang: requests go unstreamed, the one way SGLang returns the generated token ids",
                 url)
    return engine


async def _run(prompts: list[dict[str, Any]], s: Settings, run_root: Path, model: str, writer: ShardWriter,
               rc, handoff_s: float = 0.0, on_straggler=None) -> int:
    """Answer ``prompts``; each finished record goes to ``writer``, and the id of each prompt whose request outlived
    ``handoff_s`` seconds to ``on_straggler`` (a blocking call, run in a thread). Returns the number of transient
    failures."""
    g = s.generation
    target_url = os.environ.get(URL_ENV) or s.target.url  # the worker's own target wins (a pool beside its replica)
    cap = InflightCap(rc, s.redis.prefix, g.concurrency, stage="generate", target=target_url)
    broker = LeaseBroker(cap)  # the requests' leases, one Redis round trip per tick
    progress = ProgressBoard(rc, s.redis.prefix, run_root)
    progress.start_if_unset()
    board = progress.tally()  # counted here, written with the shards (not a round trip per request)
    run = run_root.name

    def count_error(e: ChatError) -> None:
        from draftsmith import metrics as M

        M.GEN_ERRORS.labels(run, e.reason).inc()
        board.incr(**{f"err:{e.reason}": 1})

    # the worker's own target wins (a pool next to its server replica); else the URL enqueue checked
    api_key = secret_value(s.target.api_key) or os.environ.get(API_KEY_ENV)
    timeout_s = g.request_timeout_s or derived_request_timeout_s(g.max_tokens, g.decode_tok_s)  # a host key: ours
    stream, extra_body = token_id_request(await _engine(target_url, model, api_key), g.stream, g.return_token_ids)
    client = ChatClient(target_url, model, api_key=api_key, request_timeout_s=timeout_s,
                        connect_timeout_s=g.connect_timeout_s, max_retries=g.max_retries, backoff_s=g.backoff_s,
                        on_error=count_error, stream=stream, extra_body=extra_body)
    failed = 0

    async def one(p: dict[str, Any]) -> None:
        nonlocal failed
        try:
            r = await _answer(p, client, broker, board, s, run, handoff_s)
        except Straggler:
            try:
                await asyncio.to_thread(on_straggler, p["id"])
                board.incr(handed_off=1)
            except Exception as e:  # Redis away: the prompt stays this job's, answered by its retry
                log.warning("prompt %s not handed off (%s); the job's retry answers it", p["id"], e)
                failed += 1
            return
        if r is None:
            failed += 1
        else:
            writer.add(r)

    async def keep_counting() -> None:
        while True:
            await asyncio.sleep(writer.flush_s)
            await asyncio.to_thread(_flush_quietly, board)

    helpers = [asyncio.create_task(cap.keep_renewed()), asyncio.create_task(writer.keep_flushing()),
               asyncio.create_task(keep_counting())]
    try:
        await asyncio.gather(*(one(p) for p in prompts))
    finally:
        for t in helpers:
            t.cancel()
        await broker.aclose()
        await client.aclose()
        _flush_quietly(board)
    return failed


def _flush_quietly(tally: ProgressTally) -> None:
    """Write the job's progress counts; Redis away only delays them (they stay counted for the next flush)."""
    import redis

    try:
        tally.flush()
    except redis.RedisError as e:
        log.warning("progress counts not written yet (%s)", e)


def generate_job(run_root: str, job_id: str, prompt_ids: list[str], model: str, settings: dict[str, Any],
                 tail: bool = False) -> dict:
    """rq job: answer ``prompt_ids`` of the run at ``run_root`` with ``model``; finished records are written to
    shards as they complete (see :class:`ShardWriter`). A request still running after
    ``generation.handoff_after_s`` is cancelled and its prompt handed to the run's tail
    (:mod:`draftsmith.generation.tail`); when the job ends it moves the tail into tail jobs (whole batches, or all
    of it when the generate queue has nothing waiting).

    Args:
        run_root: the run folder (``runs/<run>``), shared by every worker.
        job_id: deterministic job id (also the shard name).
        prompt_ids: ids in ``prompts.jsonl``.
        model: served model name (resolved by ``enqueue``).
        settings: the run's settings (:func:`draftsmith.config.run_settings`); the host's (target URL and API key,
            concurrency, timeouts) are this worker's own (:func:`draftsmith.config.settings_for_job`), and Redis
            is the worker's own connection.
        tail: a tail job (its prompts were handed off once; they are never handed off again).

    Returns:
        ``{"shard", "shards", "written", "duplicates_dropped", "skipped_done", "transient_failures",
        "handed_off"}`` (``handed_off``: prompt ids given to the tail by this run of the job).

    Raises:
        TransientFailures: after writing what succeeded, if some prompts failed transiently (rq retries the job).
        ConfigError: the job's run settings disagree with the run's record (both values named); nothing is
            written and the run's finished records stay.
        DiskSpaceError: the disk is full (what was written stays; the rest is generated again later).
    """
    from rq import get_current_job

    from draftsmith import metrics as M

    s = settings_for_job(settings)  # this worker's host settings (target URL, key, concurrency), the job's run keys
    root = run_location(run_root)
    check_job(root, run_settings(s), RUN_SECTIONS, f"generation job {job_id}", "draftsmith enqueue")
    records_dir = root / "records"
    prompts = prompt_index(root / "prompts.jsonl")  # both inherited from the worker, refreshed
    done = done_index(records_dir)
    job = get_current_job()
    if job is not None and job.timeout and job.timeout < (budget := retry_budget_s(s.generation)):
        # the enqueuer derived the job's timeout from its own request timeout; this worker's may be longer
        log.warning("generation job %s: rq timeout %d s is shorter than this worker's retries of one request "
                    "(%.0f s): set the same generation.request_timeout_s / decode_tok_s on the enqueuing host, or "
                    "leave job_timeout_s unset there", job_id, job.timeout, budget)
    gone = handed_off(job)  # handed to the tail by an earlier attempt of this job: the tail answers them
    todo = prompts.get([i for i in prompt_ids if i not in done and i not in gone])
    skipped = len(prompt_ids) - len(todo)
    rc = _redis(s)
    if not todo:
        _move_tail(rc, s, root, model, settings)
        return {"shard": None, "shards": [], "written": 0, "duplicates_dropped": 0, "skipped_done": skipped,
                "transient_failures": 0, "handed_off": []}
    t0 = time.time()
    writer = ShardWriter(records_dir, job_id)
    failed = 0
    stragglers: list[str] = []

    meta_lock = threading.Lock()  # hand-offs run in threads; each writes the job's whole meta

    def straggler(pid: str) -> None:
        with meta_lock:
            hand_off(rc, s.redis.prefix, root, pid, job)
            stragglers.append(pid)
        try:  # a whole batch of stragglers starts at once; fewer wait for company until a job ends
            _move_tail(rc, s, root, model, settings, whole_batches_only=True)
        except Exception as e:  # handed off already: the next job's end (or a resume) moves it
            log.warning("handed-off prompts not moved to a tail job yet (%s)", e)

    handoff_s = 0.0 if tail else s.generation.handoff_after_s
    try:
        failed = asyncio.run(_run(todo, s, root, model, writer, rc, handoff_s, straggler))
    finally:
        try:
            writer.flush()
        finally:
            if writer.written:
                board = ProgressBoard(rc, s.redis.prefix, root)
                board.incr(prompts_done=writer.written)
                board.set(last_result_at=repr(time.time()))
                M.GEN_PROMPTS_DONE.labels(root.name).set(len(done))
                M.GEN_PROMPTS_TOTAL.labels(root.name).set(len(prompts))
            if M.multiprocess_enabled():
                from prometheus_client import multiprocess

                multiprocess.mark_process_dead(os.getpid())
    _move_tail(rc, s, root, model, settings)
    log.info("job %s: %d records in %.1f s (%d duplicates dropped, %d transient failures, %d handed off)", job_id,
             writer.written, time.time() - t0, writer.dropped, failed, len(stragglers))
    if failed:
        # rq decides whether the job runs again (its Retry), so the message does not promise it
        raise TransientFailures(f"{failed} prompt(s) failed after every retry of their requests")
    return {"shard": writer.shards[0] if writer.shards else None, "shards": writer.shards,
            "written": writer.written, "duplicates_dropped": writer.dropped, "skipped_done": skipped,
            "transient_failures": failed, "handed_off": stragglers}


def _queue(rc, s: Settings):
    return get_queue(rc, s.redis.prefix, "generate")


def _move_tail(rc, s: Settings, root: Path, model: str, settings: dict[str, Any],
               whole_batches_only: bool | None = None) -> None:
    """The run's tail into tail jobs: whole batches only, or (``None``: at a job's end) all of it when no job waits
    in the queue (the stragglers of the run's last jobs then start together now). Redis away: the ids stay on the
    list for the next job's end (or a resume)."""
    import redis

    try:
        q = _queue(rc, s)
        whole = q.count > 0 if whole_batches_only is None else whole_batches_only
        enqueue_tail(q, root, s.redis.prefix, s.generation.batch_size, model, settings, whole,
                     job_retries=s.generation.job_retries, job_timeout_s=generation_job_timeout_s(s.generation))
    except redis.RedisError as e:
        log.warning("handed-off prompts not moved to a tail job yet (%s)", e)


def _redis(s: Settings):
    """The Redis connection of the rq worker running this job (its URL and password never travel in the job)."""
    from rq import get_current_job

    job = get_current_job()
    if job is not None:
        return job.connection
    return connect(s.redis.url)
