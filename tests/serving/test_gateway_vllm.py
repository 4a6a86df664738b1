"""The gateway in front of the real vLLM CPU server on the embedded target: answers through it are token-identical
to direct ones at temperature 0 (streamed and not), captured records are masked and build-data trains on them, and
a change of routes while streams run fails none of them."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
import redis
from draftsmith.config import CaptureConfig, DataConfig
from draftsmith.data.build import build_data
from draftsmith.serving.capture import Capture
from draftsmith.serving.gateway import Gateway, RouteTable, serve_in_background
from draftsmith.serving.routes import Routes, write_routes
from prometheus_client import REGISTRY

EMBEDDED_NAME = "SmolLM2-135M-Instruct"  # the shared vLLM server's served name (tests/conftest.py)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm")]

PROMPTS = ["Name three primary colors.", "What is 12 times 7?", "Write a haiku about rain."]


def _chat(url: str, content: str, stream: bool = False, max_tokens: int = 24) -> dict:
    body = {"model": EMBEDDED_NAME, "messages": [{"role": "user", "content": content}], "temperature": 0.0,
            "max_tokens": max_tokens, "return_token_ids": True, "stream": stream}
    if not stream:
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
        r.raise_for_status()
        c = r.json()["choices"][0]
        return {"text": c["message"]["content"], "ids": c.get("token_ids"), "finish": c["finish_reason"]}
    text, ids, finish = [], [], None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for ch in json.loads(line[6:]).get("choices", []):
                    text.append(ch["delta"].get("content") or "")
                    ids += ch.get("token_ids") or []
                    finish = ch.get("finish_reason") or finish
    return {"text": "".join(text), "ids": ids, "finish": finish}


def _count(run: str, role: str, status: str = "200") -> float:
    v = REGISTRY.get_sample_value("draftsmith_gateway_requests_total", {"run": run, "upstream": role,
                                                                         "status": status})
    return v or 0.0


def test_gateway_is_token_identical_and_captures_masked_records(vllm_server, redis_url, tmp_path, embedded_target):
    run = "gw-" + uuid.uuid4().hex[:6]
    cap = Capture(CaptureConfig(enabled=True, sample_rate=1.0, flush_records=100), tmp_path / "records", 0.0, run)
    table = RouteTable(redis.Redis.from_url(redis_url), "t", run, vllm_server)
    with serve_in_background(Gateway(table, cap, run)) as gw:
        for p in PROMPTS:
            for stream in (False, True):
                direct, through = _chat(vllm_server, p, stream), _chat(gw, p, stream)
                assert through == direct and through["ids"]
        secret = _chat(gw, "My email is jane.doe@example.com and my key is sk-abcdefghijklmnopqrstuvwx. Say hi.")
        assert secret["text"]
        metrics = httpx.get(gw + "/metrics").text
    assert _count(run, "fallback") == 2 * len(PROMPTS) + 1
    assert f'draftsmith_gateway_masked_total{{kind="email",run="{run}"}}' in metrics
    on_disk = "".join(f.read_text() for f in (tmp_path / "records").iterdir() if f.is_file())
    assert "jane.doe" not in on_disk and "sk-abcdef" not in on_disk and "[EMAIL]" in on_disk
    records = [json.loads(line) for f in (tmp_path / "records").glob("traffic-*.jsonl") for line in f.open()]
    assert len(records) == len(PROMPTS) + 1 and {r["source"] for r in records} == {"traffic"}
    answered = [r for r in records if r["status"] == "ok"]
    # the secret's answer is kept too unless the model echoed the masked text back
    assert len(answered) >= len(PROMPTS) and all(r["drafter"] is None for r in records)
    res = build_data(tmp_path / "records", tmp_path / "data", embedded_target, DataConfig(), EMBEDDED_NAME)
    assert res.stats["samples"] == len(answered) and res.manifest is not None


def test_a_routes_change_while_streams_run_fails_none(vllm_server, redis_url):
    run = "gw-" + uuid.uuid4().hex[:6]
    client = redis.Redis.from_url(redis_url)
    other = vllm_server.replace("127.0.0.1", "localhost")  # the same engine under a second name: a second upstream
    write_routes(client, "t", run, Routes(stable=vllm_server, stable_drafter="v1"))
    table = RouteTable(client, "t", run, "http://127.0.0.1:9", refresh_s=0.0)  # every request reads the routes
    body = {"model": EMBEDDED_NAME, "messages": [{"role": "user", "content": "Count from one to fifty."}],
            "temperature": 0.0, "max_tokens": 96, "stream": True}
    with serve_in_background(Gateway(table, None, run)) as gw, httpx.Client(timeout=300) as http:
        streams, lines = [], []
        for i in range(6):
            if i == 3:  # half the streams started: the canary takes every new request
                write_routes(client, "t", run, Routes(stable=vllm_server, stable_drafter="v1", canary=other,
                                                      canary_drafter="v2", canary_share=1.0))
            s = http.send(http.build_request("POST", gw + "/v1/chat/completions", json=body), stream=True)
            assert s.status_code == 200
            it = s.iter_lines()
            lines.append([next(it)])  # the first event arrived: the request is in flight on its engine
            streams.append((s, it))
        write_routes(client, "t", run, Routes(stable=other, stable_drafter="v2"))
        for (s, it), got in zip(streams, lines, strict=True):
            got.extend(it)
            s.close()
    assert all(got[-1] == "data: [DONE]" or "data: [DONE]" in got for got in lines)
    finishes = [json.loads(x[6:])["choices"][0].get("finish_reason") for got in lines for x in got
                if x.startswith("data: {") and json.loads(x[6:]).get("choices")]
    assert finishes.count("length") + finishes.count("stop") == 6
    assert _count(run, "stable") == 3 and _count(run, "canary") == 3
    assert sum(_count(run, role, "error") for role in ("stable", "canary", "fallback")) == 0
