"""Generation through SGLang asks for the generated token ids, so its turns are checked token by token.

Not proven against a recorded SGLang answer: no SGLang response with token ids for a tokenizer available offline
here was found (SGLang's docs run Qwen2.5 and Llama-3.1, whose tokenizers cannot be loaded here, and SGLang does not
run on this CPU machine). What these tests use instead, each said where it is used:

- SGLang's documented layout (sgl-project/sglang PR 30917, merged: `return_token_ids: true` on
  `/v1/chat/completions` puts `token_ids` and `prompt_token_ids` on each choice, unstreamed requests only, a streamed
  one is refused; its `/v1/models` entries say `owned_by: "sglang"`, its `protocol.py` `ModelCard`);
- around real ids: the real vLLM answer of the SmolLM2 target (tests/fixtures/generation), or the real vLLM CPU server
  itself behind a proxy that speaks that layout.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from draftsmith.generation.client import ChatClient, parse_chat_response, token_id_request
from draftsmith.target.server import served_engine

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "generation"
SMOL = "SmolLM2-135M-Instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def as_sglang(body: dict) -> dict:
    """A chat answer in SGLang's documented layout: the prompt's ids on the choice, not beside the choices."""
    out = json.loads(json.dumps(body))
    out["choices"][0]["prompt_token_ids"] = out.pop("prompt_token_ids")
    return out


def _record(body: dict) -> dict:
    r = parse_chat_response(body, 0.2)
    return {
        "schema": "draftsmith.record/1",
        "id": "sgl",
        "status": "ok",
        "error": None,
        "model": SMOL,
        "messages": [*QUESTION, {"role": "assistant", "content": r.content, "reasoning": r.reasoning}],
        "turns": [
            {
                "finish_reason": r.finish_reason,
                "usage": r.usage,
                "token_ids": r.token_ids,
                "prompt_token_ids": r.prompt_token_ids,
                "reasoning_field": r.reasoning_field,
                "latency_s": 0.2,
            }
        ],
        "sampling": {},
        "job_id": "sgl",
        "created_at": "now",
    }


def _check(tmp_path: Path, record: dict, target: Path) -> str:
    """`draftsmith build-data --check` on one record: the token-exact check of every turn."""
    (tmp_path / "runs" / "sgl" / "records").mkdir(parents=True)
    (tmp_path / "runs" / "sgl" / "records" / "job.jsonl").write_text(json.dumps(record) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTSMITH_")}
    env.update(DRAFTSMITH_RUNS_DIR=str(tmp_path / "runs"), DRAFTSMITH_TARGET__PATH=str(target))
    p = subprocess.run(
        [sys.executable, "-m", "draftsmith", "build-data", "--run", "sgl", "--check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout


def test_sglang_is_asked_for_ids_unstreamed_and_vllm_streamed():
    assert token_id_request("sglang", True, True) == (
        False,
        {"return_token_ids": True, "spaces_between_special_tokens": False},
    )
    assert token_id_request("vllm", True, True) == (
        True,
        {"return_token_ids": True, "spaces_between_special_tokens": False},
    )
    assert token_id_request(None, True, True)[0] is True  # a server that does not say: as asked
    assert token_id_request("sglang", True, False) == (True, {})  # no ids asked: nothing costs the stream


def test_an_answer_in_sglangs_layout_is_checked_token_by_token(tmp_path, embedded_target):
    """The ids are real (vLLM's answer of the SmolLM2 target); the layout is SGLang's documented one."""
    body = as_sglang(json.loads((FIX / "vllm_200_chat_token_ids.json").read_text()))
    r = parse_chat_response(body, 0.2)
    assert r.content == "The capital of France is Paris." and len(r.token_ids) == 8 and r.token_ids[-1] == 2
    assert r.prompt_token_ids == body["choices"][0]["prompt_token_ids"]
    assert len(r.prompt_token_ids) == r.usage["prompt_tokens"]
    out = _check(tmp_path, _record(body), embedded_target)
    assert (
        "check ok: 1 turns token-exact of 1 records (mismatched 0" in out and "prompts as served 1/1" in out
    )


class SGLangLayout:
    """A proxy in front of the real vLLM server that answers as SGLang documents: `owned_by: "sglang"`, a 400 for
    `return_token_ids` on a streamed chat request, the prompt's ids on the choice. The answers are vLLM's."""

    def __init__(self, upstream: str) -> None:
        self.bodies: list[dict] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _send(self, code: int, doc: dict) -> None:
                data = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                doc = httpx.get(upstream + self.path, timeout=30).json()
                for m in doc.get("data", []):
                    m["owned_by"] = "sglang"
                self._send(200, doc)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                proxy.bodies.append(body)
                if body.get("stream") and body.get("return_token_ids"):
                    # SGLang refuses the field on a streamed chat request (its ErrorResponse layout; the wording
                    # is ours, the pull request only says "a clear error")
                    self._send(
                        400,
                        {
                            "object": "error",
                            "type": "BadRequestError",
                            "code": 400,
                            "message": "return_token_ids is not supported with stream=true",
                        },
                    )
                    return
                r = httpx.post(upstream + self.path, json=body, timeout=600)
                self._send(r.status_code, as_sglang(r.json()))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.e2e
def test_generation_through_sglang_gets_real_ids_that_check_token_exact(
    vllm_server, tmp_path, embedded_target
):
    """The real vLLM CPU server behind SGLang's documented layout: the engine is told apart by `owned_by`, the
    request goes unstreamed with `return_token_ids`, and the real ids it returns check token-exact."""
    proxy = SGLangLayout(vllm_server)
    try:
        engine = served_engine(proxy.url, SMOL)
        stream, extra = token_id_request(engine, True, True)

        async def ask():
            c = ChatClient(proxy.url, SMOL, max_retries=0, stream=stream, extra_body=extra)
            try:
                return await c.chat(QUESTION, {"max_tokens": 24, "temperature": 0.0, "seed": 0})
            finally:
                await c.aclose()

        r = asyncio.run(ask())
    finally:
        proxy.close()
    assert engine == "sglang" and stream is False
    (sent,) = proxy.bodies
    assert sent["return_token_ids"] is True and not sent.get("stream")
    assert r.token_ids and len(r.token_ids) == r.usage["completion_tokens"] and r.prompt_token_ids
    body = {
        "model": SMOL,
        "usage": r.usage,
        "choices": [
            {
                "index": 0,
                "finish_reason": r.finish_reason,
                "token_ids": r.token_ids,
                "prompt_token_ids": r.prompt_token_ids,
                "message": {"role": "assistant", "content": r.content},
            }
        ],
    }
    out = _check(tmp_path, _record(body), embedded_target)
    assert (
        "check ok: 1 turns token-exact of 1 records (mismatched 0" in out and "prompts as served 1/1" in out
    )
