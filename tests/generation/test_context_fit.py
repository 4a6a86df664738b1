"""Over-long answers are not silently "done": ``enqueue`` warns when prompt + ``generation.max_tokens`` may exceed
the server's context (its ``max_model_len`` from ``/v1/models``, here the real vLLM CPU server's 4096), and
``status`` counts answers cut at their length limit apart from the successes."""

from __future__ import annotations

import pytest
from draftsmith.config import load_settings
from draftsmith.generation.enqueue import warn_context
from draftsmith.generation.progress import snapshot
from draftsmith.generation.store import record_tally, write_shard
from draftsmith.target.server import served_context, served_models

pytestmark = pytest.mark.e2e


def prompt(i: int, chars: int) -> dict:
    return {"id": f"p{i}", "messages": [{"role": "user", "content": "x" * chars}], "source": "t", "row": i}


def test_enqueue_warns_when_prompt_and_answer_exceed_the_context(vllm_server):
    (name,) = served_models(vllm_server)
    assert served_context(vllm_server, name) == 4096
    said: list[str] = []
    s = load_settings(overrides={"target": {"url": vllm_server}, "generation": {"max_tokens": 1024}})
    assert warn_context(s, name, [prompt(0, 300), prompt(1, 500)], said.append) == 0 and said == []
    # one prompt of about 4,000 tokens (12,000 characters) beside a 1,024-token answer cannot fit 4,096
    assert warn_context(s, name, [prompt(0, 300), prompt(1, 12000)], said.append) == 1
    assert "1 of 2 prompts may not fit" in said[-1] and "max_model_len 4096" in said[-1]
    long = load_settings(overrides={"target": {"url": vllm_server}, "generation": {"max_tokens": 8192}})
    assert warn_context(long, name, [prompt(0, 300)], said.append) == 1
    assert "generation.max_tokens 8192 >= the server's context (4096" in said[-1]


def test_status_counts_cut_answers_apart(tmp_path):
    def rec(i: int, finish: str, status: str = "ok") -> dict:
        return {"id": f"p{i}", "status": status, "turns": [{"finish_reason": finish}]}

    run = tmp_path / "run"
    (run / "records").mkdir(parents=True)
    (run / "prompts.jsonl").write_text("".join(f'{{"id": "p{i}", "messages": []}}\n' for i in range(5)))
    write_shard(run / "records", "a", [rec(0, "stop"), rec(1, "length"), rec(2, "length")])
    write_shard(run / "records", "b", [rec(3, "stop"), {"id": "p4", "status": "error", "turns": []}])
    tally = record_tally(run / "records")
    assert (len(tally.ids), tally.errors, tally.cut) == (5, 1, 2)
    line = snapshot(None, "x", run).line()
    assert line.startswith("[done] 5/5 done (1 error records; 2 answers cut at their length limit)"), line
