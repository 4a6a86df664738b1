"""Error classification against recorded real vLLM responses, and retries through a fault-injecting proxy in
front of the real vLLM CPU server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from draftsmith.generation.client import ChatClient, ChatError, classify_status, parse_chat_response

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "generation"


def test_context_length_400s_are_permanent():
    for name in ("vllm_400_prompt_too_long.json", "vllm_400_max_tokens.json"):
        err = classify_status(400, (FIX / name).read_text())
        assert err.reason == "context_length" and not err.transient


def test_sglang_input_too_long_is_context_length():
    """SGLang's own words (its ErrorResponse layout; SGLang cannot run here, see fixtures/generation/README.md)."""
    err = classify_status(400, (FIX / "sglang_400_input_too_long.json").read_text())
    assert err.reason == "context_length" and not err.transient and err.status == 400


def test_a_refused_key_is_auth_and_keeps_the_prompt_pending():
    """vLLM's API-key middleware answers 401 {"error": "Unauthorized"}: never a permanent error record."""
    err = classify_status(401, '{"error": "Unauthorized"}')
    assert err.reason == "auth" and err.transient and "check the key" in err.message and "HTTP 401" in err.message
    assert classify_status(403, "forbidden").reason == "auth"


def test_other_statuses():
    assert classify_status(404, (FIX / "vllm_404_model.json").read_text()).reason == "http_4xx"
    assert classify_status(400, '{"error": {"message": "bad temperature"}}').reason == "http_4xx"
    assert classify_status(503, "overloaded").transient
    assert classify_status(429, "slow down").reason == "http_429"
    assert classify_status(429, "").transient


def test_parse_real_response_reads_token_ids_and_usage():
    body = json.loads((FIX / "vllm_200_chat_token_ids.json").read_text())
    r = parse_chat_response(body, 0.5)
    assert r.content == "The capital of France is Paris."
    assert r.finish_reason == "stop"
    assert len(r.token_ids) == r.usage["completion_tokens"] == 8
    assert r.token_ids[-1] == 2  # <|im_end|>: the end-of-turn token is generated and reported
    assert r.prompt_token_ids == body["prompt_token_ids"] and len(r.prompt_token_ids) == r.usage["prompt_tokens"]
    assert r.reasoning is None and r.reasoning_field is None


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_both_reasoning_fields_are_read(field):
    body = json.loads((FIX / "vllm_200_chat_token_ids.json").read_text())
    body["choices"][0]["message"].pop("reasoning", None)
    body["choices"][0]["message"][field] = "Let me think."
    r = parse_chat_response(body, 0.1)
    assert (r.reasoning, r.reasoning_field) == ("Let me think.", field)


def test_invalid_body_is_transient():
    with pytest.raises(ChatError) as e:
        parse_chat_response({"error": "x"}, 0.1)
    assert e.value.reason == "invalid_response" and e.value.transient


@pytest.mark.e2e
def test_retries_through_faults_then_succeeds(vllm_server, fault_proxy):
    proxy = fault_proxy(vllm_server, faults=["503", "reset", "429"])
    seen: list[str] = []

    async def go():
        c = ChatClient(proxy.url, "SmolLM2-135M-Instruct", max_retries=5, backoff_s=0.05, on_error=lambda e: seen.append(e.reason))
        try:
            return await c.chat([{"role": "user", "content": "Say hi."}], {"max_tokens": 8, "temperature": 0})
        finally:
            await c.aclose()

    r = asyncio.run(go())
    assert seen == ["http_5xx", "connection", "http_429"]
    assert r.usage["completion_tokens"] >= 1 and r.content


@pytest.mark.e2e
def test_retries_give_up_after_max(vllm_server, fault_proxy):
    proxy = fault_proxy(vllm_server, faults=["503"] * 10)

    async def go():
        c = ChatClient(proxy.url, "SmolLM2-135M-Instruct", max_retries=2, backoff_s=0.01)
        try:
            await c.chat([{"role": "user", "content": "hi"}], {"max_tokens": 4})
        finally:
            await c.aclose()

    with pytest.raises(ChatError) as e:
        asyncio.run(go())
    assert e.value.reason == "http_5xx" and proxy.requests == 3
