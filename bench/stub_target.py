"""A fast local OpenAI-compatible chat server standing in for the target (for the pool's drills, tests, benchmarks).

It answers ``POST /v1/chat/completions`` after ``--delay-s`` seconds with a vLLM-shaped body (``choices[0].message``,
``choices[0].token_ids``, ``usage``), lists one model at ``GET /v1/models``, and reports what it saw at
``GET /stats`` (requests, requests in flight now and at most, the last ``Authorization`` header). It is plain asyncio
over HTTP/1.1 keep-alive, one process, so one core serves thousands of requests per second. The shape of the body is
that of ``tests/fixtures/generation/vllm_200_chat_token_ids.json`` (recorded from vLLM 0.32). It is the pool that is
under test here, not a model.

A request with ``"stream": true`` is answered as vLLM streams (server-sent events, :func:`stream_chunks`): the first
chunk as soon as a sequence slot is free (``--max-concurrency``), the rest after the delay, so time queued for a
slot comes before the first token as in an engine.

A long-tailed server (``--tail-fraction 0.02 --tail-factor 20``): that fraction of the prompts is answered
``--tail-factor`` times slower, as a reasoning model's longest answers are. Which prompts are slow follows from a
hash of the request's messages, so the same prompt is slow for every client and every attempt (a long answer stays
long when it is asked again), and the slow share is the same for every client that sends the same prompts.

Run: ``python bench/stub_target.py --port 8123 [--delay-s 0.5] [--model stub] [--answer-bytes N]
[--tail-fraction F --tail-factor K]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import zlib


class Stats:
    """Counters of one server: requests, in flight now, most in flight at once, the last Authorization header."""

    def __init__(self) -> None:
        self.requests = 0
        self.inflight = 0
        self.max_inflight = 0
        self.auth: str | None = None
        self.slow = 0  # requests answered at the tail's latency


def is_slow(raw: bytes, fraction: float) -> bool:
    """Whether the request body ``raw`` falls in the slow ``fraction`` of prompts (a hash of its messages)."""
    if fraction <= 0:
        return False
    msgs = json.loads(raw or b"{}").get("messages", [])
    key = json.dumps([m.get("content") for m in msgs]).encode()
    return zlib.crc32(key) % 10_000 < fraction * 10_000


def chat_body(model: str, req: dict, n: int, answer_bytes: int = 0) -> dict:
    """A vLLM-shaped chat completion answering ``req`` (content and 8 token ids derived from the request number;
    ``answer_bytes`` pads the content to about that many bytes)."""
    prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in req.get("messages", [])) + 4
    ids = [(n * 7 + i) % 49000 + 100 for i in range(8)]
    return {
        "id": f"chatcmpl-{n}", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": f"answer {n}".ljust(answer_bytes, "."), "reasoning_content": None,
                                             "tool_calls": []},
                     "logprobs": None, "finish_reason": "stop", "stop_reason": None, "token_ids": ids}],
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + 8, "completion_tokens": 8},
        "prompt_token_ids": None,
    }


def stream_chunks(body: dict) -> list[dict]:
    """``body`` (from :func:`chat_body`) as vLLM streams it with ``return_token_ids`` and ``include_usage``: a first
    chunk with the role and the prompt's token ids (sent with the first token), one with the text and the token
    ids, one with the finish reason, and the usage."""
    ch = body["choices"][0]
    head = {"id": body["id"], "object": "chat.completion.chunk", "created": 0, "model": body["model"]}
    return [
        {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None}], "prompt_token_ids": body["prompt_token_ids"]},
        {**head, "choices": [{"index": 0, "delta": {"content": ch["message"]["content"]}, "logprobs": None,
                              "finish_reason": None, "token_ids": ch["token_ids"][:-1]}]},
        {**head, "choices": [{"index": 0, "delta": {"content": ""}, "logprobs": None, "finish_reason": "stop",
                              "stop_reason": None, "token_ids": ch["token_ids"][-1:]}]},
        {**head, "choices": [], "usage": body["usage"]},
    ]


def _event(chunk: dict | str) -> bytes:
    """One server-sent event as one HTTP/1.1 chunk (chunked transfer encoding)."""
    data = f"data: {chunk if isinstance(chunk, str) else json.dumps(chunk)}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, model: str, delay_s: float,
                 stats: Stats, answer_bytes: int = 0, slots: asyncio.Semaphore | None = None,
                 tail_fraction: float = 0.0, tail_factor: float = 1.0) -> None:
    """Serve one keep-alive connection; a request in the slow ``tail_fraction`` takes ``tail_factor`` x ``delay_s``."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path = lines[0].split(" ")[:2]
            headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
            n = int(headers.get("content-length") or 0)
            raw = await reader.readexactly(n) if n else b""
            if method == "POST" and path.endswith("/chat/completions"):
                stats.requests += 1
                num = stats.requests
                stats.auth = headers.get("authorization")
                stats.inflight += 1
                stats.max_inflight = max(stats.max_inflight, stats.inflight)
                delay = delay_s
                if is_slow(raw, tail_fraction):
                    stats.slow += 1
                    delay = delay_s * tail_factor
                req = json.loads(raw or b"{}")
                body = chat_body(model, req, num, answer_bytes)
                chunks = stream_chunks(body) if req.get("stream") else []
                try:
                    async with slots or contextlib.nullcontext():  # a fixed number of sequences: the rest wait
                        if chunks:  # the first token comes when a sequence slot is free; the answer takes ``delay``
                            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                         b"Transfer-Encoding: chunked\r\n\r\n" + _event(chunks[0]))
                            await writer.drain()
                        if delay:
                            await asyncio.sleep(delay)
                        if chunks:
                            writer.write(b"".join(_event(c) for c in [*chunks[1:], "[DONE]"]) + b"0\r\n\r\n")
                            await writer.drain()
                finally:
                    stats.inflight -= 1
                if chunks:
                    continue
                code = 200
            elif path.endswith("/models"):
                code, body = 200, {"object": "list", "data": [{"id": model, "object": "model", "max_model_len": 4096}]}
            elif path == "/stats":
                code, body = 200, {"requests": stats.requests, "inflight": stats.inflight,
                                   "max_inflight": stats.max_inflight, "auth": stats.auth, "slow": stats.slow}
            elif path == "/health":
                code, body = 200, {}
            else:
                code, body = 404, {"error": "not found"}
            data = json.dumps(body).encode()
            writer.write(f"HTTP/1.1 {code} OK\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                         "\r\n".encode() + data)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


async def serve(port: int, model: str, delay_s: float, answer_bytes: int = 0, max_concurrency: int = 0,
                tail_fraction: float = 0.0, tail_factor: float = 1.0) -> None:
    """Serve until killed; prints ``READY <port>`` once listening."""
    stats = Stats()
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency > 0 else None
    server = await asyncio.start_server(
        lambda r, w: handle(r, w, model, delay_s, stats, answer_bytes, slots, tail_fraction, tail_factor),
        "127.0.0.1", port, backlog=1024)
    print(f"READY {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--model", default="stub")
    ap.add_argument("--delay-s", type=float, default=0.0)
    ap.add_argument("--answer-bytes", type=int, default=0, help="Pad every answer to about this many bytes.")
    ap.add_argument("--max-concurrency", type=int, default=0,
                    help="Requests served at once (each takes --delay-s); the rest wait (0 = no limit).")
    ap.add_argument("--tail-fraction", type=float, default=0.0,
                    help="Share of prompts answered --tail-factor times slower (chosen by a hash of the messages).")
    ap.add_argument("--tail-factor", type=float, default=20.0)
    a = ap.parse_args(argv)
    try:
        asyncio.run(serve(a.port, a.model, a.delay_s, a.answer_bytes, a.max_concurrency, a.tail_fraction,
                          a.tail_factor))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
