"""Helpers of the training-data tests: fixture tokenizers per chat-template family and record builders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TEMPLATES = FIXTURES / "templates"
SMOLLM2_RECORDS = FIXTURES / "data" / "smollm2_records.jsonl"


def make_record(rid: str, turns: list[tuple[str, str, str | None, list[int] | None]], model: str = "m",
                system: str | None = None, finish: str = "stop") -> dict:
    """A draftsmith.record/1 dict from ``[(user, answer, reasoning, token_ids)]`` turns."""
    messages = [{"role": "system", "content": system}] if system else []
    out_turns = []
    for user, answer, reasoning, ids in turns:
        messages.append({"role": "user", "content": user})
        messages.append({"role": "assistant", "content": answer, "reasoning": reasoning})
        out_turns.append({"finish_reason": finish, "usage": {}, "token_ids": ids,
                          "reasoning_field": "reasoning" if reasoning else None, "latency_s": 0.1})
    return {"schema": "draftsmith.record/1", "id": rid, "status": "ok", "error": None, "model": model,
            "messages": messages, "turns": out_turns, "sampling": {}, "job_id": "t", "created_at": "x"}


def write_records(folder: Path, records: list, name: str = "job.jsonl") -> Path:
    """Write records (dicts or raw strings) as one shard under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    (folder / name).write_text("".join(line + "\n" for line in lines))
    return folder


@pytest.fixture(scope="session")
def smollm2_records() -> list[dict]:
    """Real records of SmolLM2-135M-Instruct from the vLLM CPU server (recorded by fixtures/data/record_smollm2.py)."""
    return [json.loads(line) for line in SMOLLM2_RECORDS.read_text().splitlines()]
