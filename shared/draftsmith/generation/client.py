"""An async client for OpenAI-compatible chat servers (vLLM, SGLang) that classifies every error.

Transient errors (connection resets, timeouts, HTTP 5xx and 429, unreadable bodies) are retried with exponential
backoff and jitter; a 400 for exceeding the context is permanent and never retried (vllm-project/vllm#20409); other 4xx
are permanent too. Every error, retried or not, is counted by reason.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from draftsmith.log import get_logger
from draftsmith.target.server import auth_headers

log = get_logger(__name__)

# "auth" (401/403) is not answered by a retry, but it must not become a permanent error record either: the prompt
# stays pending until the key is fixed (a permanent error record would mark it done for good).
TRANSIENT = {"connection", "timeout", "http_5xx", "http_429", "invalid_response", "auth"}
_CONTEXT_MARKERS = (
    "maximum context length", "context length", "max_model_len", "maximum model length", "too long",
    "exceeds the model", "max_tokens", "is longer than",
    "exceeds the maximum allowed length",  # SGLang: "Input length (N tokens) exceeds the maximum allowed length (M tokens)"
)


class ChatError(Exception):
    """A failed chat request: ``reason`` is the counter key, ``transient`` says whether a retry may help."""

    def __init__(self, reason: str, message: str, status: int | None = None) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
        self.status = status

    @property
    def transient(self) -> bool:
        return self.reason in TRANSIENT


def classify_status(status: int, body: str) -> ChatError:
    """Map an HTTP error status and body to a :class:`ChatError` reason."""
    text = body[:500]
    if status == 429:
        return ChatError("http_429", text, status)
    if status in (401, 403):
        return ChatError("auth", f"HTTP {status}: the server refused the API key, check the key "
                                 f"(DRAFTSMITH_TARGET__API_KEY): {text[:200]}", status)
    if status >= 500:
        return ChatError("http_5xx", text, status)
    if status == 400 and any(m in body.lower() for m in _CONTEXT_MARKERS):
        return ChatError("context_length", text, status)
    return ChatError("http_4xx", text, status)


def classify_exception(exc: BaseException) -> ChatError:
    """Map a transport exception to a :class:`ChatError` reason (``timeout`` or ``connection``)."""
    if isinstance(exc, httpx.TimeoutException):
        return ChatError("timeout", f"{type(exc).__name__}: {exc}")
    return ChatError("connection", f"{type(exc).__name__}: {exc}")


@dataclass
class ChatResult:
    """One assistant turn as the server produced it."""

    content: str
    reasoning: str | None
    reasoning_field: str | None
    finish_reason: str | None
    usage: dict[str, int]
    token_ids: list[int] | None
    model: str
    latency_s: float
    prompt_token_ids: list[int] | None = None  # the prompt as the server tokenized it (vLLM ``return_token_ids``)


def parse_chat_response(body: dict[str, Any], latency_s: float) -> ChatResult:
    """Read one chat completion body (reads ``reasoning`` and ``reasoning_content``; notes which one).

    Raises:
        ChatError: ``invalid_response`` when the body has no choice or message.
    """
    try:
        choice = body["choices"][0]
        msg = choice["message"]
    except (KeyError, IndexError, TypeError) as e:
        raise ChatError("invalid_response", f"no choices[0].message in response: {str(body)[:200]}") from e
    reasoning, field = None, None
    for name in ("reasoning", "reasoning_content"):
        if msg.get(name):
            reasoning, field = msg[name], name
            break
    usage = body.get("usage") or {}
    return ChatResult(
        content=msg.get("content") or "",
        reasoning=reasoning,
        reasoning_field=field,
        finish_reason=choice.get("finish_reason"),
        usage={k: int(v) for k, v in usage.items() if isinstance(v, int)},
        token_ids=choice.get("token_ids"),
        model=body.get("model", ""),
        latency_s=latency_s,
        prompt_token_ids=body.get("prompt_token_ids") or choice.get("prompt_token_ids"),
    )


def merge_stream_chunks(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat completion body that streamed ``chunks`` (``chat.completion.chunk`` objects, in order) add up to:
    deltas of ``content`` and of ``reasoning``/``reasoning_content`` joined, ``token_ids`` (vLLM's
    ``return_token_ids``) concatenated, the last ``finish_reason``, the ``usage`` of the final chunk
    (``stream_options.include_usage``) and the ``prompt_token_ids`` of the first one. The result reads with
    :func:`parse_chat_response` like a non-streamed body.

    Raises:
        ChatError: a chunk is an error object (the server failed mid-stream), classified by its ``code``.
    """
    content: list[str] = []
    reasoning: list[str] = []
    field: str | None = None
    ids: list[int] | None = None
    finish = model = None
    usage: dict[str, Any] | None = None
    prompt_ids = None
    for c in chunks:
        err = c.get("error") if isinstance(c.get("error"), dict) else (c if c.get("object") == "error" else None)
        if err is not None:
            code = err.get("code")
            raise classify_status(code if isinstance(code, int) else 500, str(err.get("message") or err))
        model = c.get("model") or model
        usage = c.get("usage") or usage
        if prompt_ids is None:
            prompt_ids = c.get("prompt_token_ids")
        for ch in c.get("choices") or []:
            d = ch.get("delta") or {}
            content.append(d.get("content") or "")
            for name in ("reasoning", "reasoning_content"):
                if d.get(name):
                    reasoning.append(d[name])
                    field = name
            if ch.get("token_ids") is not None:
                ids = ids if ids is not None else []
                ids.extend(ch["token_ids"])  # one token a chunk: extended in place, never copied
            finish = ch.get("finish_reason") or finish
    if not chunks:
        return {}
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
    if field:
        message[field] = "".join(reasoning)
    return {"model": model or "", "choices": [{"index": 0, "message": message, "finish_reason": finish,
                                               "token_ids": ids}],
            "usage": usage, "prompt_token_ids": prompt_ids}


@functools.cache
def token_id_request(engine: str | None, stream: bool, return_token_ids: bool) -> tuple[bool, dict[str, Any]]:
    """Whether to stream, and the request fields that ask ``engine`` (:func:`draftsmith.target.server.served_engine`)
    for the generated token ids (``return_token_ids``: False asks for none).

    vLLM answers ``return_token_ids: true`` streamed and whole: ``choices[i].token_ids`` (each chunk's ids when
    streamed), the prompt's as ``prompt_token_ids``. SGLang answers the same field with the same names
    (``choices[i].token_ids``, raw generated ids before its reasoning and tool-call parsers;
    ``choices[i].prompt_token_ids``), on unstreamed chat requests only: it refuses the field with ``stream: true``
    (sgl-project/sglang PR 30917, "Add return_token_ids support to completions and chat completions APIs").
    So for SGLang the ids cost the stream (the hand-off then counts from the request's start).

    Returns:
        ``(stream, extra_body)``: ``extra_body`` goes into every chat request.
    """
    if not return_token_ids:
        return stream, {}
    # the text must decode from the ids: no space around special tokens (a vLLM field SGLang's sampling knows too)
    extra: dict[str, Any] = {"return_token_ids": True, "spaces_between_special_tokens": False}
    return (False if engine == "sglang" else stream), extra


def tls_context() -> ssl.SSLContext:
    """The TLS context of every client of this process, built once (loading the CA bundle costs ~0.1-0.2 s, and a
    work-horse forked after the pool built it inherits it)."""
    return httpx.create_ssl_context()


def warm_http() -> None:
    """Run, once in this process, the imports that httpx, httpcore and anyio make lazily on a client's first
    request (the anyio backend, httpcore's pool): a worker pool calls this before forking, so each work-horse
    inherits them instead of importing them again per job (~18 % of a horse's CPU against a fast server).
    Tries one connection to a closed local port (refused at once); nothing is sent anywhere."""
    import socket

    import anyio._backends._asyncio  # noqa: F401
    import httpcore  # noqa: F401

    tls_context()
    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

        async def touch() -> None:
            async with httpx.AsyncClient(verify=tls_context(), timeout=2.0) as c:
                try:
                    await c.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={})
                except httpx.HTTPError:
                    pass

        asyncio.run(touch())


class ChatClient:
    """Sends chat requests with retries. One instance per job; share its ``httpx.AsyncClient`` across requests.

    Args:
        base_url: server URL without ``/v1``.
        model: served model name.
        request_timeout_s / connect_timeout_s: client timeouts, in seconds (long generations need long ones).
        max_retries: retries of a transient error; backoff_s doubles per retry with +-50 % jitter.
        on_error: called with every :class:`ChatError` (retried ones too), for counting.
        stream: stream each answer (server-sent events), so the client sees its first token: ``chat``'s
            ``on_first_token`` runs then. The request timeout bounds the whole stream.
        extra_body: fields sent with every request (the token-id request of :func:`token_id_request`).
    """

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, request_timeout_s: float = 3600,
                 connect_timeout_s: float = 10, max_retries: int = 5, backoff_s: float = 1.0,
                 on_error: Callable[[ChatError], None] | None = None, max_connections: int = 256,
                 stream: bool = False, extra_body: dict[str, Any] | None = None) -> None:
        self.url = f"{base_url.rstrip('/')}/v1/chat/completions"
        self.model = model
        self.stream = stream
        self.extra_body = dict(extra_body or {})
        self.request_timeout_s = request_timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.on_error = on_error or (lambda e: None)
        headers = auth_headers(api_key)  # api_key may be target.api_key's SecretStr
        self._http = httpx.AsyncClient(
            headers=headers,
            verify=tls_context(),
            timeout=httpx.Timeout(request_timeout_s, connect=connect_timeout_s),
            # vLLM closes idle keep-alive connections after 5 s: expire ours sooner to avoid the reset race
            limits=httpx.Limits(max_connections=max_connections, keepalive_expiry=2.0),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def chat(self, messages: list[dict[str, str]], sampling: dict[str, Any],
                   before_attempt: Callable[[], Awaitable[None]] | None = None,
                   after_attempt: Callable[[], Awaitable[None]] | None = None,
                   on_first_token: Callable[[], None] | None = None) -> ChatResult:
        """Send one chat request, retrying transient errors.

        ``before_attempt``/``after_attempt`` wrap every attempt (the shared in-flight cap uses them);
        ``on_first_token`` runs when an attempt's first chunk arrives (streaming only: the server sends it with the
        answer's first token, after the request waited in the engine's queue and its prompt was read).

        Raises:
            ChatError: a permanent error, or a transient one after ``max_retries`` retries.
        """
        body = {"model": self.model, "messages": messages, **self.extra_body, **sampling}
        if self.stream:
            body.update(stream=True, stream_options={"include_usage": True})
        attempt = 0
        while True:
            if before_attempt:
                await before_attempt()
            t0 = time.monotonic()
            try:
                if self.stream:
                    return await self._streamed(body, t0, on_first_token)
                resp = await self._http.post(self.url, json=body)
                latency = time.monotonic() - t0
                if resp.status_code != 200:
                    raise classify_status(resp.status_code, resp.text)
                try:
                    data = resp.json()
                except ValueError as e:
                    raise ChatError("invalid_response", f"body is not JSON: {resp.text[:200]}") from e
                return parse_chat_response(data, latency)
            except ChatError as e:
                err = e
            except httpx.HTTPError as e:
                err = classify_exception(e)
            finally:
                if after_attempt:
                    await after_attempt()
            self.on_error(err)
            if not err.transient or attempt >= self.max_retries:
                raise err
            delay = self.backoff_s * (2**attempt) * random.uniform(0.5, 1.5)
            log.warning("retrying after %s (attempt %d/%d, %.1f s)", err.reason, attempt + 1, self.max_retries, delay)
            attempt += 1
            await asyncio.sleep(delay)

    async def _streamed(self, body: dict[str, Any], t0: float, on_first_token: Callable[[], None] | None
                        ) -> ChatResult:
        """One streamed attempt: the server-sent events read to ``[DONE]`` (or the end), bounded as a whole by the
        request timeout (httpx's read timeout bounds only the gap between two chunks).

        Raises:
            ChatError: an HTTP error status, a chunk that is not JSON or is an error object, a timeout.
            httpx.HTTPError: the connection failed (classified by the caller).
        """
        chunks: list[dict[str, Any]] = []
        try:
            async with asyncio.timeout(self.request_timeout_s), self._http.stream("POST", self.url, json=body) as resp:
                if resp.status_code != 200:
                    await resp.aread()
                    raise classify_status(resp.status_code, resp.text)
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue  # blank separators, SSE comments
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    try:
                        chunks.append(json.loads(data))
                    except ValueError as e:
                        raise ChatError("invalid_response", f"stream chunk is not JSON: {data[:200]}") from e
                    if len(chunks) == 1 and on_first_token:
                        on_first_token()
        except TimeoutError:
            raise ChatError("timeout", f"no whole answer within request_timeout_s {self.request_timeout_s:g} s "
                                       f"({len(chunks)} chunks read)") from None
        body = merge_stream_chunks(chunks)
        if not body or not body["choices"][0]["finish_reason"]:  # a cut stream is not a short answer
            raise ChatError("invalid_response", f"the stream ended before the answer did ({len(chunks)} chunks)")
        return parse_chat_response(body, time.monotonic() - t0)
