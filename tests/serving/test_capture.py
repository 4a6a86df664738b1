"""Capture of served requests: masking, which answers are kept, the records written through the run's RecordStore
(read back by the records reader build-data uses), retention, and the route table over a real Redis."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import redis
from draftsmith.artifacts.record_store import record_store
from draftsmith.config import CaptureConfig
from draftsmith.data.records import iter_records, record_files
from draftsmith.serving.capture import Answer, Capture, StreamReader, answer_of_json, prune
from draftsmith.serving.capture_mask import Masker
from draftsmith.serving.gateway import RouteTable
from draftsmith.serving.routes import Routes, write_routes

SECRETS = ("write to jane.doe@example.com with key sk-abcdefghijklmnopqrstuvwx, call +1 415-555-0132, card "
           "4111 1111 1111 1111 from 10.1.2.3")


def test_masker_replaces_each_kind_and_leaves_ordinary_numbers():
    text, counts = Masker(["api_key", "email", "phone", "card", "ip"]).mask(SECRETS)
    assert text == "write to [EMAIL] with key [API_KEY], call [PHONE], card [CARD] from [IP]"
    assert counts == {"api_key": 1, "email": 1, "phone": 1, "card": 1, "ip": 1}
    plain = "12345678 + 4111111111111112 = ? Version 1.2.3, 3.14159"
    assert Masker(["phone", "card", "ip", "email"]).mask(plain) == (plain, {})
    assert Masker([], [r"ACME-\d{6}"]).mask("order ACME-123456 shipped") == ("order [MASKED] shipped",
                                                                             {"custom": 1})


def _capture(tmp_path, **kw) -> Capture:
    cfg = CaptureConfig(enabled=True, sample_rate=1.0, **kw)
    return Capture(cfg, tmp_path / "records", temperature=0.0, run="t")


def _answer(content="Paris.", finish="stop") -> Answer:
    return Answer(content=content, finish_reason=finish, choices=1, model="m", latency_s=0.5,
                  usage={"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7})


def test_an_answer_at_the_training_temperature_is_kept_others_give_the_prompt_alone(tmp_path):
    cap = _capture(tmp_path)
    q = {"messages": [{"role": "user", "content": "Capital of France?"}], "temperature": 0, "max_tokens": 8}
    rec, _ = cap.record(q, _answer(), drafter="v2", upstream="canary")
    assert rec["status"] == "ok" and rec["messages"][-1] == {"role": "assistant", "content": "Paris.",
                                                             "reasoning": None}
    assert (rec["source"], rec["drafter"], rec["upstream"]) == ("traffic", "v2", "canary")
    assert rec["turns"][0]["finish_reason"] == "stop" and rec["sampling"]["max_tokens"] == 8
    hot, _ = cap.record({**q, "temperature": 0.7}, _answer(), drafter=None, upstream="stable")
    assert hot["status"] == "error" and hot["error"]["reason"] == "unanswered" and hot["turns"] == []
    assert "training temperature" in hot["error"]["message"] and hot["messages"] == q["messages"]
    unset, _ = cap.record({"messages": q["messages"]}, _answer(), drafter=None, upstream="stable")
    assert unset["status"] == "error"
    leaked, n = cap.record(q, _answer("mail me at a@b.org"), drafter=None, upstream="stable")
    assert leaked["status"] == "error" and "masked" in leaked["error"]["message"] and n == {"email": 1}
    tools, _ = cap.record({**q, "tools": [{"type": "function"}]}, _answer(), drafter=None, upstream="stable")
    assert tools["status"] == "error"
    history = {"messages": q["messages"] + [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]}
    assert cap.record(history, _answer(), drafter=None, upstream="stable") == (None, {})


def test_the_prompt_is_masked_before_it_is_held(tmp_path):
    cap = _capture(tmp_path)
    rec, counts = cap.record({"messages": [{"role": "user", "content": SECRETS}], "temperature": 0.0}, _answer(),
                             drafter=None, upstream="stable")
    assert "@" not in json.dumps(rec) and "sk-" not in json.dumps(rec) and sum(counts.values()) == 5


def test_stream_reader_rebuilds_the_answer_from_split_events():
    events = [{"model": "m", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
              {"choices": [{"index": 0, "delta": {"reasoning_content": "think"}}]},
              {"choices": [{"index": 0, "delta": {"content": "Hel"}}]},
              {"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]},
              {"choices": [], "usage": {"completion_tokens": 2}}]
    raw = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    r = StreamReader()
    for i in range(0, len(raw), 7):
        r.feed(raw[i:i + 7])
    a = r.finish(1.0)
    assert (a.content, a.reasoning, a.reasoning_field, a.finish_reason, a.choices, a.model, a.usage) == (
        "Hello", "think", "reasoning_content", "stop", 1, "m", {"completion_tokens": 2})
    j = answer_of_json({"model": "m", "choices": [{"message": {"content": "Hi"}, "finish_reason": "length"}]}, 0.1)
    assert (j.content, j.finish_reason, j.choices) == ("Hi", "length", 1)


def test_flushed_records_are_the_runs_and_build_data_reads_them(tmp_path):
    cap = _capture(tmp_path, flush_records=2)
    qs = [{"messages": [{"role": "user", "content": f"q{i}"}], "temperature": 0.0} for i in range(3)]
    due = [cap.add(cap.record(q, _answer(f"a{i}"), drafter="v1", upstream="stable")[0]) for i, q in enumerate(qs)]
    assert due == [False, True, True]
    assert cap.flush() == 3
    again = cap.record(qs[0], _answer("a0"), drafter="v1", upstream="stable")[0]
    cap.add(again)
    assert cap.flush() == 0  # a prompt already recorded is not written twice
    files = record_files(tmp_path / "records")
    assert [f.name.startswith("traffic-") for f in files] == [True]
    read = [x for x in iter_records(files)]
    assert [r["messages"][-1]["content"] for r, _ in read] == ["a0", "a1", "a2"]
    assert record_store(tmp_path / "records").tally().ids == {r["id"] for r, _ in read}


def test_retention_prunes_old_captured_shards_only(tmp_path):
    d = tmp_path / "records"
    store = record_store(d)
    store.write_shard("gen-job-1", [{"schema": "draftsmith.record/1", "id": "g1", "status": "ok", "messages": []}])
    cap = _capture(tmp_path)
    cap.add(cap.record({"messages": [{"role": "user", "content": "q"}], "temperature": 0.0}, _answer(),
                       drafter=None, upstream="stable")[0])
    cap.flush()
    assert prune(d, 30.0) == []
    removed = prune(d, 30.0, now=datetime.now(UTC) + timedelta(days=31))
    assert len(removed) == 1 and removed[0].startswith("traffic-")
    assert [f.name for f in record_files(d)] == ["gen-job-1.jsonl"] and store.tally().ids == {"g1"}


def test_route_table_reads_routes_at_most_once_per_refresh(redis_url):
    client = redis.Redis.from_url(redis_url)
    table = RouteTable(client, "ds", "r", "http://fallback:8000/", refresh_s=3600)
    assert table.pick(0.0).role == "fallback" and table.pick(0.0).url == "http://fallback:8000"
    write_routes(client, "ds", "r", Routes(stable="http://s:1", stable_drafter="v1", canary="http://c:1",
                                           canary_drafter="v2", canary_share=0.25))
    assert table.pick(0.0).role == "fallback"  # within the refresh interval the old routes stand
    table.refresh_s = 0.0
    assert (table.pick(0.1).role, table.pick(0.1).drafter) == ("canary", "v2")
    assert (table.pick(0.3).role, table.pick(0.3).url) == ("stable", "http://s:1")
    broken = RouteTable(redis.Redis(port=1), "ds", "r", "http://fallback:8000", refresh_s=0.0)
    assert broken.pick(0.0).role == "fallback"  # Redis unreachable: no routes known, the fallback serves


def test_capture_is_off_by_default_and_a_bad_mask_expression_is_named():
    import pytest
    from pydantic import ValidationError

    assert CaptureConfig().enabled is False
    assert Capture(CaptureConfig(), "unused", 0.0, "t").sampled(0.0) is False
    with pytest.raises(ValidationError, match=r"mask_regex '\(bad' is not a regular expression"):
        CaptureConfig(mask_regex=["(bad"])
