"""Reading generation records (``runs/<run>/records/*.jsonl``, docs/formats.md §2).

The reader never stops on a bad line: malformed JSON, an unknown schema or a record without an assistant turn is
returned as a :class:`Skip` with its reason, so that the build counts every dropped sample (failure mode 9 in
``../shared/notes/failure-modes.md``: samples silently skipped made a dataset ~1000x smaller).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftsmith.errors import DataError
from draftsmith.log import get_logger

log = get_logger(__name__)

RECORD_SCHEMA = "draftsmith.record/1"


@dataclass(frozen=True)
class Skip:
    """A line or record that cannot become a training sample.

    Attributes:
        reason: short machine-readable reason (``malformed_json``, ``unknown_schema``, ``no_assistant_turn``, ...).
        where: ``<file>:<line>`` of the offending line.
        record_id: the prompt id when the line parsed, else None.
    """

    reason: str
    where: str
    record_id: str | None = None


def record_files(records_dir: Path) -> list[Path]:
    """The record shards of a run, sorted by name (``*.jsonl``; ``.meta.json`` and the manifest are not shards).

    Raises:
        DataError: the folder does not exist or holds no shard.
    """
    records_dir = Path(records_dir)
    if not records_dir.is_dir():
        raise DataError(
            f"no records folder at {records_dir}", "run `draftsmith enqueue` and the generation workers first"
        )
    files = sorted(p for p in records_dir.glob("*.jsonl") if p.is_file())
    if not files:
        raise DataError(f"{records_dir} holds no record shard (*.jsonl)", "wait for the generation workers to finish")
    return files


def assistant_indices(messages: list[dict[str, Any]]) -> list[int]:
    """Positions of the assistant messages in ``messages``."""
    return [i for i, m in enumerate(messages) if m.get("role") == "assistant"]


def check_record(rec: Any, where: str) -> Skip | None:
    """Structural check of one parsed record; returns a :class:`Skip` when it cannot be used, else None."""
    if not isinstance(rec, dict):
        return Skip("malformed_record", where)
    rid = rec.get("id") if isinstance(rec.get("id"), str) else None
    if rec.get("schema") != RECORD_SCHEMA:
        return Skip("unknown_schema", where, rid)
    if rec.get("status") != "ok":
        err = rec.get("error") or {}
        reason = err.get("reason", "unknown") if isinstance(err, dict) else "unknown"
        return Skip(f"record_error:{reason}", where, rid)
    msgs = rec.get("messages")
    if not isinstance(msgs, list) or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in msgs):
        return Skip("malformed_record", where, rid)
    a_idx = assistant_indices(msgs)
    if not a_idx:
        return Skip("no_assistant_turn", where, rid)
    turns = rec.get("turns")
    if not isinstance(turns, list) or len(turns) != len(a_idx):
        return Skip("turns_mismatch", where, rid)
    return None


def iter_records(files: list[Path]) -> Iterator[dict[str, Any] | Skip]:
    """Yield every usable record of the shards in order, or a :class:`Skip` for each line that is not usable.

    Empty lines are ignored; a shard with no line at all is logged and yields nothing. The first record with a given
    id wins (a retried job may write the same prompt twice, ``<job>.r1.jsonl``); later copies are skipped as
    ``duplicate``.
    """
    seen: set[str] = set()
    for path in files:
        n_lines = 0
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                n_lines += 1
                where = f"{path.name}:{lineno}"
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    yield Skip("malformed_json", where)
                    continue
                skip = check_record(rec, where)
                if skip is not None:
                    yield skip
                    continue
                if rec["id"] in seen:
                    yield Skip("duplicate", where, rec["id"])
                    continue
                seen.add(rec["id"])
                rec["_where"] = where
                yield rec
        if n_lines == 0:
            log.warning("record shard %s is empty", path)
