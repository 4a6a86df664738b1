"""The hand-off bound counts from the answer's first token: a request that waits inside the engine for a sequence
slot is not cancelled for that wait. The real client, the real in-flight cap on the real Redis, and
bench/stub_target.py with one sequence slot standing in for a server whose KV cache holds fewer sequences than are
in flight (vLLM answers as fast as it can, so such a queue cannot be had from it here); the streamed chunks the stub
sends have the shape of vLLM 0.32's (tests/fixtures/generation/vllm_200_chat_stream.jsonl, recorded)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import redis
from draftsmith.generation.client import ChatClient, ChatError, merge_stream_chunks, parse_chat_response
from draftsmith.generation.jobs import Straggler, _answer
from draftsmith.generation.progress import ProgressBoard
from draftsmith.jobqueue.inflight import InflightCap, LeaseBroker
from pool_helpers import Stub, settings_for

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "generation"
DELAY_S, HANDOFF_S = 0.4, 1.0  # one slot: four answers end at 0.4, 0.8, 1.2, 1.6 s after they were all sent


async def _answer_all(s, url: str, rc, run_root: Path, stream: bool) -> list:
    client = ChatClient(url, "stub", max_retries=0, stream=stream)
    broker = LeaseBroker(InflightCap(rc, s.redis.prefix, 16, target=url))
    board = ProgressBoard(rc, s.redis.prefix, run_root).tally()
    prompts = [{"id": f"p{i}", "messages": [{"role": "user", "content": f"What is {i} + {i}?"}]} for i in range(4)]
    try:
        return await asyncio.gather(*(_answer(p, client, broker, board, s, "r", HANDOFF_S) for p in prompts),
                                    return_exceptions=True)
    finally:
        await broker.aclose()
        await client.aclose()


@pytest.mark.parametrize("stream,handed_off", [(True, 0), (False, 2)])
def test_time_queued_in_the_engine_does_not_count(tmp_path, redis_url, stream, handed_off):
    stub = Stub(DELAY_S, 0, "--max-concurrency", "1")
    try:
        s = settings_for(tmp_path, redis_url, stub.url, stream=stream)
        out = asyncio.run(_answer_all(s, stub.url, redis.Redis.from_url(redis_url), tmp_path / "r", stream))
    finally:
        stub.close()
    assert sum(isinstance(r, Straggler) for r in out) == handed_off, out
    records = [r for r in out if isinstance(r, dict)]
    assert len(records) == 4 - handed_off
    for r in records:  # streamed or not, the same record
        assert r["messages"][-1]["content"].startswith("answer ")
        assert r["turns"][0]["finish_reason"] == "stop" and len(r["turns"][0]["token_ids"]) == 8
        assert r["turns"][0]["usage"]["completion_tokens"] == 8


def test_real_vllm_stream_adds_up_to_its_unstreamed_answer():
    """Recorded from vLLM 0.32 (CPU, SmolLM2-135M-Instruct), the same request streamed and not, seed 0."""
    chunks = [json.loads(x) for x in (FIX / "vllm_200_chat_stream.jsonl").read_text().splitlines()]
    whole = parse_chat_response(json.loads((FIX / "vllm_200_chat_unstreamed.json").read_text()), 0.1)
    r = parse_chat_response(merge_stream_chunks(chunks), 0.1)
    assert r.content == whole.content and r.token_ids == whole.token_ids and len(r.token_ids) > 4
    assert r.prompt_token_ids == whole.prompt_token_ids
    assert r.finish_reason == whole.finish_reason and r.usage == whole.usage
    with pytest.raises(ChatError) as e:  # an error object mid-stream is a classified error, not a short answer
        merge_stream_chunks([*chunks[:2], {"error": {"message": "engine died", "code": 500}}])
    assert e.value.reason == "http_5xx" and e.value.transient


def test_a_stream_cut_before_its_finish_reason_is_transient_not_a_short_answer(tmp_path):
    """A stub that sends the recorded first chunks of vLLM's stream and then ``[DONE]`` (a proxy that ended the
    stream early): the client retries, and then gives up with ``invalid_response``, never a record."""
    import socket
    import threading

    chunks = (FIX / "vllm_200_chat_stream.jsonl").read_text().splitlines()[:3]
    body = "".join(f"data: {c}\n\n" for c in chunks) + "data: [DONE]\n\n"
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def serve() -> None:
        for _ in range(2):  # the attempt and its one retry
            conn, _addr = srv.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: {len(body)}\r\n"
                             f"Connection: close\r\n\r\n{body}".encode())

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    errors: list[ChatError] = []

    async def ask():
        c = ChatClient(f"http://127.0.0.1:{port}", "m", stream=True, max_retries=1, backoff_s=0.01,
                       on_error=errors.append)
        try:
            return await c.chat([{"role": "user", "content": "hi"}], {"max_tokens": 24})
        finally:
            await c.aclose()

    try:
        with pytest.raises(ChatError) as e:
            asyncio.run(ask())
    finally:
        t.join(10)
        srv.close()
    assert e.value.reason == "invalid_response" and [x.reason for x in errors] == ["invalid_response"] * 2
