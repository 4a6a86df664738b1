"""The gateway: an OpenAI-compatible pass-through in front of the engines that routes each request by the run's
routes and captures sampled chat requests (docs/serving.md).

Every path is passed through unchanged (``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``, ``/health``,
...), bodies and event streams byte for byte; only ``/metrics`` is the gateway's own. Each new request picks its
engine once, from the routes (:func:`draftsmith.serving.routes.read_routes`, re-read at most every
``gateway.routes_refresh_s``): ``canary`` with probability ``canary_share``, else ``stable``; with no routes stored,
``gateway.upstream`` (default ``target.url``). A request keeps the engine it started on to its last byte, so a
change of routes fails no request in flight.

Built on Starlette, uvicorn and httpx (streaming both ways); the routing idea follows blue/green and canary
deployment behind a reverse proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import httpx
import redis
import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from draftsmith import metrics as M
from draftsmith.log import get_logger
from draftsmith.serving.capture import Answer, Capture, StreamReader, answer_of_json
from draftsmith.serving.routes import Routes, read_routes

log = get_logger(__name__)

# headers that belong to one hop (RFC 9110 §7.6.1) or that the server recomputes
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade", "host",
        "content-length"}
CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class Upstream:
    """The engine one request goes to: its ``role`` (stable, canary or fallback), base ``url`` (without ``/v1``)
    and the ``drafter`` version it serves (None when unknown or the target alone)."""

    role: str
    url: str
    drafter: str | None


class RouteTable:
    """The run's routes as the gateway uses them: read from Redis at most every ``refresh_s`` seconds; when Redis
    cannot be read, the last routes read stay in use (logged once per failure streak).

    Args:
        client: a Redis client of the run's database; ``prefix``: ``redis.prefix``; ``run``: the run's name;
        fallback: the engine URL used while no routes are stored; ``refresh_s``: the longest age of the routes.
    """

    def __init__(self, client: redis.Redis, prefix: str, run: str, fallback: str, refresh_s: float = 1.0) -> None:
        self.client, self.prefix, self.run, self.refresh_s = client, prefix, run, refresh_s
        self.fallback = Upstream("fallback", fallback.rstrip("/"), None)
        self.routes: Routes | None = None
        self._read_at = float("-inf")
        self._failing = False

    def current(self) -> Routes | None:
        """The routes, read again when older than ``refresh_s``."""
        now = time.monotonic()
        if now - self._read_at >= self.refresh_s:
            self._read_at = now
            try:
                self.routes = read_routes(self.client, self.prefix, self.run)
                self._failing = False
            except (redis.RedisError, ValidationError) as e:
                if not self._failing:
                    log.warning("cannot read the routes of run %s (%s); keeping the last ones", self.run, e)
                self._failing = True
        return self.routes

    def pick(self, rand: float) -> Upstream:
        """The engine of a new request whose uniform draw is ``rand`` (in [0, 1))."""
        r = self.current()
        if r is None:
            return self.fallback
        if r.canary and rand < r.canary_share:
            return Upstream("canary", r.canary.rstrip("/"), r.canary_drafter)
        return Upstream("stable", r.stable.rstrip("/"), r.stable_drafter)


class Gateway:
    """The pass-through's state: the route table, one pooled httpx client, the capture (or None) and the run name.

    :meth:`app` builds the Starlette application; :meth:`aclose` closes the client and writes what capture holds.
    """

    def __init__(self, table: RouteTable, capture: Capture | None, run: str, timeout_s: float = 600.0) -> None:
        self.table, self.capture, self.run = table, capture, run
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0), limits=limits)
        self._flushing = asyncio.Lock()
        self._rng = random.Random()

    def app(self) -> Starlette:
        """The ASGI application: ``/metrics`` and every other path passed through."""
        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            ticker = None
            if self.capture is not None:
                ticker = asyncio.create_task(flush_periodically(self, min(1.0, self.capture.config.flush_s)))
            try:
                yield
            finally:
                if ticker is not None:
                    ticker.cancel()
                await self.aclose()

        return Starlette(
            routes=[Route("/metrics", self.metrics, methods=["GET"]),
                    Route("/{path:path}", self.proxy, methods=["GET", "POST", "PUT", "DELETE", "PATCH"])],
            lifespan=lifespan,
        )

    async def metrics(self, request: Request) -> Response:
        """Prometheus text of this process's metrics (docs/metrics.md)."""
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    async def proxy(self, request: Request) -> Response:
        """Pass one request to its engine and the answer back, streamed as it comes; capture it when sampled."""
        t0 = time.perf_counter()
        body = await request.body()
        up = self.table.pick(self._rng.random())
        chat = None
        if (self.capture is not None and request.method == "POST" and request.url.path == CHAT_PATH
                and self.capture.sampled(self._rng.random())):
            try:
                chat = json.loads(body)
            except ValueError:
                chat = None  # the engine answers the bad body with its own 400
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        headers["accept-encoding"] = "identity"  # the answer is read for capture and passed on as it is
        url = up.url + request.url.path + (f"?{request.url.query}" if request.url.query else "")
        req = self.client.build_request(request.method, url, headers=headers, content=body)
        M.GATEWAY_ADDED_LATENCY.labels(self.run).observe(time.perf_counter() - t0)
        sent = time.perf_counter()
        try:
            resp = await self.client.send(req, stream=True)
        except httpx.HTTPError as e:
            M.GATEWAY_REQUESTS.labels(self.run, up.role, "error").inc()
            log.warning("upstream %s (%s) failed: %s", up.role, up.url, e)
            return JSONResponse({"error": {"message": f"the gateway could not reach the {up.role} engine at "
                                           f"{up.url}: {e}", "type": "upstream_unreachable", "code": 502}},
                                status_code=502)
        out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP}
        capture = chat if isinstance(chat, dict) and resp.status_code == 200 else None
        return StreamingResponse(self._relay(resp, up, capture, sent), status_code=resp.status_code,
                                 headers=out_headers, background=BackgroundTask(resp.aclose))

    async def _relay(self, resp: httpx.Response, up: Upstream, chat: dict | None, sent: float) -> AsyncIterator[bytes]:
        """The engine's bytes as they come; at the end, the status counted and the request captured."""
        stream = bool(chat and chat.get("stream"))
        reader, whole = StreamReader(), bytearray()
        status = str(resp.status_code)
        try:
            async for chunk in resp.aiter_raw():
                if chat is not None:
                    reader.feed(chunk) if stream else whole.extend(chunk)
                yield chunk
        except httpx.HTTPError as e:
            status = "error"
            log.warning("upstream %s (%s) broke mid-answer: %s", up.role, up.url, e)
            raise
        finally:
            M.GATEWAY_REQUESTS.labels(self.run, up.role, status).inc()
        if chat is not None:
            latency = time.perf_counter() - sent
            answer: Answer | None
            if stream:
                answer = reader.finish(latency)
            else:
                try:
                    answer = answer_of_json(json.loads(bytes(whole)), latency)
                except ValueError:
                    answer = None
            try:
                await self._capture(chat, answer, up)
            except Exception:  # the client has its whole answer: a capture that fails must not break its request
                log.exception("capturing a request failed; the request itself was served")

    async def _capture(self, chat: dict, answer: Answer | None, up: Upstream) -> None:
        """Record one served request (masked) and write the held records when due, off the event loop."""
        cap = self.capture
        assert cap is not None
        rec, masked = cap.record(chat, answer, drafter=up.drafter, upstream=up.role)
        for kind, n in masked.items():
            M.GATEWAY_MASKED.labels(self.run, kind).inc(n)
        if rec is None:
            return
        M.GATEWAY_CAPTURED.labels(self.run, "answered" if rec["status"] == "ok" else "prompt").inc()
        if cap.add(rec):
            await self.flush()

    async def flush(self) -> None:
        """Write the held captured records now (one writer at a time; a failed write is logged and kept)."""
        if self.capture is None:
            return
        async with self._flushing:
            try:
                await asyncio.to_thread(self.capture.flush)
            except Exception:  # the loop boundary: serving goes on, the records stay held for the next flush
                log.exception("writing captured records failed; they are kept for the next flush")

    async def aclose(self) -> None:
        """Write what capture holds and close the upstream client."""
        await self.flush()
        await self.client.aclose()


async def flush_periodically(gateway: Gateway, every_s: float) -> None:
    """Flush the gateway's capture when due, checked every ``every_s`` seconds (so a quiet gateway still writes)."""
    while True:
        await asyncio.sleep(every_s)
        if gateway.capture is not None and gateway.capture.due():
            await gateway.flush()


@contextlib.contextmanager
def serve_in_background(gateway: Gateway, addr: str = "127.0.0.1", port: int = 0,
                        timeout_s: float = 30.0) -> Iterator[str]:
    """Run ``gateway`` under uvicorn in a thread of this process; yields its base URL and stops it on exit (what
    capture holds is written). For tests and ``bench/capture.py``; the service runs ``draftsmith gateway``.

    Raises:
        RuntimeError: the server did not start within ``timeout_s`` seconds.
    """
    server = uvicorn.Server(uvicorn.Config(gateway.app(), host=addr, port=port, log_level="warning",
                                           access_log=False, lifespan="on"))
    thread = threading.Thread(target=server.run, name="gateway", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the gateway did not start on {addr}:{port}")
        time.sleep(0.02)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{addr}:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout=timeout_s)
