"""Capture of served chat requests into the run's records, through the run's RecordStore (docs/serving.md).

A sampled request (``capture.sample_rate``) becomes one record of the generator's shape (docs/formats.md §2, schema
``draftsmith.record/1``) marked ``source: "traffic"``, with ``captured_at``, the drafter version that served it
(``drafter``) and the upstream role (``upstream``: stable, canary or fallback). The answer is kept only when the
target produced it as generation would have: the request's temperature is the run's training temperature
(``generation.temperature``), one choice, no tools or constrained output, a finished text answer, and nothing in
the answer had to be masked (a placeholder is not what the target wrote). Otherwise the prompt alone is kept, as a
record with ``status: "error"`` and reason ``unanswered`` (with the cause in ``message``), which build-data counts
and skips and a refresh can answer again. Requests with other roles than system and user (an earlier assistant turn,
tool results) or non-text content are not captured: their history was not the target's.

Masking (:class:`~draftsmith.serving.capture_mask.Masker`) runs before a record is held in memory for writing; the
records go to the run's records folder only (``runs/<run>/records/traffic-*.jsonl``), in shards of up to
``capture.flush_records``; shards older than ``capture.retention_days`` are pruned.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from draftsmith.artifacts import records as artifact
from draftsmith.artifacts.location import Location
from draftsmith.artifacts.record_store import record_store
from draftsmith.artifacts.records import RECORD_SCHEMA
from draftsmith.config import CaptureConfig
from draftsmith.generation.sources import prompt_id
from draftsmith.log import get_logger
from draftsmith.serving.capture_mask import Masker

log = get_logger(__name__)

SHARD_PREFIX = "traffic-"
SOURCE = "traffic"
# request fields under which the answer is not what plain generation at the same temperature would give
_CONSTRAINED = ("tools", "functions", "response_format", "guided_json", "guided_regex", "guided_choice",
                "guided_grammar", "structured_outputs", "logit_bias", "logits_processors")
PRUNE_EVERY_S = 3600.0


@dataclass
class Answer:
    """What the engine answered to one chat request, read from its JSON or its event stream.

    Attributes:
        content: the answer text (None when the engine sent none).
        reasoning: the reasoning text, when the engine split it off.
        reasoning_field: the response field that carried it (``reasoning`` or ``reasoning_content``).
        finish_reason: ``stop``, ``length``, ... of the one choice.
        choices: how many choices the answer had.
        usage: the engine's token counts, when it sent them.
        model: the served model name.
        latency_s: seconds from sending the request to the end of the answer.
    """

    content: str | None = None
    reasoning: str | None = None
    reasoning_field: str | None = None
    finish_reason: str | None = None
    choices: int = 0
    usage: dict[str, Any] | None = None
    model: str | None = None
    latency_s: float = 0.0


def answer_of_json(body: dict[str, Any], latency_s: float) -> Answer:
    """The :class:`Answer` of a non-streamed chat completion ``body`` (OpenAI shape)."""
    choices = body.get("choices") or []
    a = Answer(choices=len(choices), usage=body.get("usage"), model=body.get("model"), latency_s=latency_s)
    if choices:
        msg = choices[0].get("message") or {}
        a.content, a.finish_reason = msg.get("content"), choices[0].get("finish_reason")
        for f in ("reasoning", "reasoning_content"):
            if msg.get(f):
                a.reasoning, a.reasoning_field = msg[f], f
    return a


@dataclass
class StreamReader:
    """Rebuilds an :class:`Answer` from a chat completion's server-sent events, fed in arbitrary byte chunks."""

    answer: Answer = field(default_factory=Answer)
    _buf: bytes = b""
    _parts: list[str] = field(default_factory=list)
    _reasoning: list[str] = field(default_factory=list)
    _indices: set[int] = field(default_factory=set)

    def feed(self, chunk: bytes) -> None:
        """Take the next bytes of the stream (events may be split anywhere)."""
        self._buf += chunk
        *events, self._buf = self._buf.replace(b"\r\n", b"\n").split(b"\n\n")
        for event in events:
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    self._data(line[5:].strip())

    def _data(self, data: bytes) -> None:
        if not data or data == b"[DONE]":
            return
        try:
            ev = json.loads(data)
        except ValueError:
            return
        a = self.answer
        a.model = ev.get("model") or a.model
        if ev.get("usage"):
            a.usage = ev["usage"]
        for ch in ev.get("choices") or []:
            self._indices.add(int(ch.get("index", 0)))
            if ch.get("index", 0) != 0:
                continue
            delta = ch.get("delta") or {}
            if delta.get("content"):
                self._parts.append(delta["content"])
            for f in ("reasoning", "reasoning_content"):
                if delta.get(f):
                    self._reasoning.append(delta[f])
                    a.reasoning_field = f
            a.finish_reason = ch.get("finish_reason") or a.finish_reason

    def finish(self, latency_s: float) -> Answer:
        """The answer as read so far (call once the stream ended)."""
        a = self.answer
        a.content = "".join(self._parts) if self._parts or a.finish_reason else None
        a.reasoning = "".join(self._reasoning) or None
        a.choices, a.latency_s = len(self._indices), latency_s
        return a


def capturable(request: dict[str, Any]) -> bool:
    """Whether a chat request's prompt can become a record: text messages of system and user roles only."""
    msgs = request.get("messages")
    return (isinstance(msgs, list) and bool(msgs)
            and all(isinstance(m, dict) and m.get("role") in ("system", "user") and isinstance(m.get("content"), str)
                    for m in msgs)
            and any(m["role"] == "user" for m in msgs))


def unanswered_cause(request: dict[str, Any], answer: Answer | None, temperature: float) -> str | None:
    """Why the answer cannot be kept as the target's own at the training ``temperature``; None when it can."""
    if answer is None:
        return "the engine gave no answer"
    t = request.get("temperature")
    if not isinstance(t, int | float) or float(t) != float(temperature):
        return f"temperature {t!r} is not the training temperature {temperature}"
    if request.get("n", 1) != 1 or answer.choices != 1:
        return "more than one choice"
    if any(request.get(k) for k in _CONSTRAINED):
        return "tools or constrained output"
    if not isinstance(answer.content, str) or answer.finish_reason not in ("stop", "length"):
        return f"no finished text answer (finish_reason {answer.finish_reason!r})"
    return None


class Capture:
    """Turns sampled served requests into records of one run and writes them through its RecordStore.

    Thread-safe: the gateway adds from its event loop and flushes from a worker thread.

    Args:
        config: the ``capture`` section.
        records_dir: the run's records folder (``RunPaths.records``; a local path or an object-store location).
        temperature: the run's training temperature (``generation.temperature``).
        run: the run's name (metric label).

    Raises:
        ValueError: a mask kind or expression is invalid.
    """

    def __init__(self, config: CaptureConfig, records_dir: Location, temperature: float, run: str) -> None:
        self.config, self.records_dir, self.temperature, self.run = config, records_dir, temperature, run
        self.masker = Masker(config.mask, config.mask_regex)
        self._held: dict[str, dict[str, Any]] = {}
        self._since = time.monotonic()
        self._lock = threading.Lock()
        self._last_prune = float("-inf")

    def sampled(self, rand: float) -> bool:
        """Whether a request whose uniform draw is ``rand`` (in [0, 1)) is captured."""
        return self.config.enabled and rand < self.config.sample_rate

    def record(self, request: dict[str, Any], answer: Answer | None, *, drafter: str | None,
               upstream: str) -> tuple[dict[str, Any] | None, Counter[str]]:
        """The masked record of one served request, and the masked spans by kind; (None, {}) when not capturable.

        ``request``: the chat request body; ``answer``: what the engine answered (None when it failed).
        """
        if not capturable(request):
            return None, Counter()
        masked: Counter[str] = Counter()
        msgs = []
        for m in request["messages"]:
            text, n = self.masker.mask(m["content"])
            masked += n
            msgs.append({"role": m["role"], "content": text})
        cause = unanswered_cause(request, answer, self.temperature)
        kept: dict[str, Any] | None = None
        if cause is None:
            assert answer is not None and answer.content is not None
            content, n_answer = self.masker.mask(answer.content)
            reasoning, n_reason = self.masker.mask(answer.reasoning) if answer.reasoning else (None, Counter())
            masked += n_answer + n_reason
            if n_answer or n_reason:
                cause = "the answer held text that had to be masked"
            else:
                kept = {"role": "assistant", "content": content, "reasoning": reasoning}
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        rec: dict[str, Any] = {
            "schema": RECORD_SCHEMA, "id": prompt_id(msgs), "status": "ok" if kept else "error",
            "error": None if kept else {"reason": "unanswered", "message": cause, "turn": 0},
            "model": answer.model if answer else None,
            "messages": msgs + ([kept] if kept else []),
            "turns": [] if not kept else [{
                "finish_reason": answer.finish_reason, "usage": answer.usage, "token_ids": None,
                "prompt_token_ids": None, "reasoning_field": answer.reasoning_field,
                "latency_s": round(answer.latency_s, 4),
            }] if answer else [],
            "sampling": {k: request.get(k) for k in ("temperature", "top_p", "max_tokens", "seed")},
            "job_id": None, "created_at": now,
            "source": SOURCE, "captured_at": now, "drafter": drafter, "upstream": upstream,
        }
        if rec["sampling"]["max_tokens"] is None:
            rec["sampling"]["max_tokens"] = request.get("max_completion_tokens")
        return rec, masked

    def add(self, rec: dict[str, Any]) -> bool:
        """Hold ``rec`` for the next shard (one per prompt id: a prompt asked twice is held once); True when the
        buffer should be flushed now (``capture.flush_records`` held, or the oldest waited ``capture.flush_s``)."""
        with self._lock:
            if not self._held:
                self._since = time.monotonic()
            self._held.setdefault(rec["id"], rec)
            return self.due()

    def due(self) -> bool:
        """Whether the held records should be written now."""
        return bool(self._held) and (len(self._held) >= self.config.flush_records
                                     or time.monotonic() - self._since >= self.config.flush_s)

    def flush(self) -> int:
        """Write the held records as one shard ``traffic-<UTC time>-<hex>`` of the run's records, then prune old
        captured shards (at most hourly); returns how many records were new to the run (a prompt already recorded
        is dropped by the store).

        Raises:
            OSError / StorageError: the write failed; the records are held again for the next flush.
        """
        with self._lock:
            held, self._held = list(self._held.values()), {}
        written = 0
        if held:
            name = f"{SHARD_PREFIX}{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"
            for r in held:
                r["job_id"] = name
            try:
                _, dropped = record_store(self.records_dir).write_shard(name, held)
            except BaseException:
                with self._lock:
                    for r in held:
                        self._held.setdefault(r["id"], r)
                raise
            written = len(held) - dropped
            log.info("captured %d records of served traffic into %s (%d already recorded)", written, name, dropped)
        if self.config.retention_days is not None and time.monotonic() - self._last_prune >= PRUNE_EVERY_S:
            self._last_prune = time.monotonic()
            prune(self.records_dir, self.config.retention_days)
        return written


def prune(records_dir: Location, retention_days: float, now: datetime | None = None) -> list[str]:
    """Remove the captured shards (``traffic-*``) of a records folder whose sidecar is older than
    ``retention_days``, sidecar first (so a reader never sees a counted shard without its file), then rebuild the
    manifest and journal; returns the removed shards' names. Generated shards are never touched.

    Raises:
        DataError: a sidecar is unreadable.
    """
    cutoff = (now or datetime.now(UTC)) - timedelta(days=retention_days)
    removed = []
    for side in artifact.sidecar_files(records_dir):
        if not side.name.startswith(SHARD_PREFIX):
            continue
        try:
            meta = artifact.read_sidecar(side)
        except (OSError, ValueError) as e:
            raise artifact.unreadable_sidecar(side, e) from e
        created = datetime.strptime(meta["created_at"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        if created < cutoff:
            shard = artifact.shard_of(side)
            side.unlink()
            shard.unlink(missing_ok=True)
            removed.append(shard.name)
    if removed:
        record_store(records_dir).rebuild_manifest()
        log.info("pruned %d captured shards older than %g days: %s", len(removed), retention_days, removed)
    return removed
