"""The generation job: one batch of prompts in, one record shard out. Runs inside an rq work-horse.

A job sends its prompts to the target concurrently (asyncio), each request holding a lease of the shared in-flight
cap. Multi-turn prompts regenerate every assistant turn in order, each turn seeing the target's own earlier
answers. Permanent errors (context length, other 4xx) become records with ``status: error``; prompts that still
fail transiently after the client's retries are left out of the shard and the job raises at the end, so rq's
Retry runs it again for those prompts only (the rest are on disk and skipped).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from draftsmith.config import Settings
from draftsmith.generation.client import ChatClient, ChatError
from draftsmith.generation.inflight import InflightCap
from draftsmith.generation.progress import ProgressBoard
from draftsmith.generation.store import RECORD_SCHEMA, done_ids, load_prompts, write_shard
from draftsmith.log import get_logger

log = get_logger(__name__)


class TransientFailures(RuntimeError):
    """Some prompts of the job failed transiently after every retry; rq's Retry runs the job again."""


def sampling_params(s: Settings) -> dict[str, Any]:
    """The sampling part of a chat request body (also stored in every record)."""
    g = s.generation
    body: dict[str, Any] = {"temperature": g.temperature, "top_p": g.top_p, "max_tokens": g.max_tokens}
    if g.seed is not None:
        body["seed"] = g.seed
    return body


async def _answer(prompt: dict[str, Any], client: ChatClient, cap: InflightCap, board: ProgressBoard,
                  s: Settings, run: str) -> dict[str, Any] | None:
    """Regenerate every assistant turn of one prompt; None when a transient error outlived the retries."""
    from draftsmith import metrics as M

    sampling = sampling_params(s)
    body_extra = {"return_token_ids": True} if s.generation.return_token_ids else {}
    messages: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    record: dict[str, Any] = {"schema": RECORD_SCHEMA, "id": prompt["id"], "status": "ok", "error": None,
                              "model": client.model}
    token: list[str] = []

    async def before() -> None:
        token.append(await cap.acquire())
        M.GEN_INFLIGHT.labels(run).inc()

    async def after() -> None:
        M.GEN_INFLIGHT.labels(run).dec()
        if token:
            await asyncio.to_thread(cap.release, token.pop())

    for msg in prompt["messages"]:
        messages.append(dict(msg))
        if msg["role"] != "user":
            continue
        # the conversation so far, without reasoning (servers drop it from history)
        history = [{"role": m["role"], "content": m["content"]} for m in messages]
        try:
            res = await client.chat(history, {**sampling, **body_extra}, before, after)
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


async def _run(prompts: list[dict[str, Any]], s: Settings, run_root: Path, model: str, job_id: str) -> tuple[list, int]:
    from draftsmith.queues import connect

    rc = connect(s.redis.url)
    g = s.generation
    cap = InflightCap(rc, s.redis.prefix, g.concurrency, lease_s=g.request_timeout_s + 60)
    board = ProgressBoard(rc, s.redis.prefix, run_root)
    board.start_if_unset()
    run = run_root.name

    def count_error(e: ChatError) -> None:
        from draftsmith import metrics as M

        M.GEN_ERRORS.labels(run, e.reason).inc()
        board.incr(**{f"err:{e.reason}": 1})

    client = ChatClient(s.target.url, model, api_key=s.target.api_key, request_timeout_s=g.request_timeout_s,
                        connect_timeout_s=g.connect_timeout_s, max_retries=g.max_retries, backoff_s=g.backoff_s,
                        on_error=count_error)
    try:
        results = await asyncio.gather(*(_answer(p, client, cap, board, s, run) for p in prompts))
    finally:
        await client.aclose()
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    records = []
    for r in results:
        if r is not None:
            r["job_id"] = job_id
            r["created_at"] = now
            records.append(r)
    return records, sum(1 for r in results if r is None)


def generate_job(run_root: str, job_id: str, prompt_ids: list[str], model: str, settings: dict[str, Any]) -> dict:
    """rq job: answer ``prompt_ids`` of the run at ``run_root`` with ``model`` and write one record shard.

    Args:
        run_root: the run folder (``runs/<run>``), shared by every worker.
        job_id: deterministic job id (also the shard name).
        prompt_ids: ids in ``prompts.jsonl``.
        model: served model name (resolved by ``enqueue``).
        settings: the resolved :class:`Settings` as JSON.

    Returns:
        ``{"shard", "written", "duplicates_dropped", "skipped_done", "transient_failures"}``.

    Raises:
        TransientFailures: after writing what succeeded, if some prompts failed transiently (rq retries the job).
    """
    from draftsmith import metrics as M

    s = Settings.model_validate(settings)
    root = Path(run_root)
    records_dir = root / "records"
    all_prompts = load_prompts(root / "prompts.jsonl")
    done = done_ids(records_dir)
    todo = [all_prompts[i] for i in prompt_ids if i in all_prompts and i not in done]
    skipped = len(prompt_ids) - len(todo)
    if not todo:
        return {"shard": None, "written": 0, "duplicates_dropped": 0, "skipped_done": skipped, "transient_failures": 0}
    t0 = time.time()
    try:
        records, failed = asyncio.run(_run(todo, s, root, model, job_id))
        shard, dropped = write_shard(records_dir, job_id, records)
        from draftsmith.queues import connect

        board = ProgressBoard(connect(s.redis.url), s.redis.prefix, root)
        board.incr(prompts_done=len(records) - dropped)
        board.set(last_result_at=repr(time.time()))
        M.GEN_PROMPTS_DONE.labels(root.name).set(len(done) + len(records) - dropped)
        M.GEN_PROMPTS_TOTAL.labels(root.name).set(len(all_prompts))
    finally:
        if M.multiprocess_enabled():
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(os.getpid())
    log.info("job %s: %d records in %.1f s (%d duplicates dropped, %d transient failures)", job_id,
             len(records) - dropped, time.time() - t0, dropped, failed)
    if failed:
        raise TransientFailures(f"{failed} prompt(s) failed after every retry; the job will be retried for them")
    return {"shard": shard.name if shard else None, "written": len(records) - dropped, "duplicates_dropped": dropped,
            "skipped_done": skipped, "transient_failures": failed}
