"""A fault-injecting HTTP proxy in front of the real vLLM server: the first requests fail as listed
("503", "429", "reset", "400ctx"), then requests are forwarded unchanged; it also counts requests in flight.
Only the failures are made up; every answer comes from the real server."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "generation"


class FaultProxy:
    def __init__(self, upstream: str, faults: list[str]) -> None:
        self.upstream = upstream.rstrip("/")
        self.faults = list(faults)
        self.requests = 0
        self.inflight = 0
        self.max_concurrent = 0
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def _relay(self, method: str) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                with proxy.lock:
                    if method == "POST":
                        proxy.requests += 1
                    fault = proxy.faults.pop(0) if (method == "POST" and proxy.faults) else None
                if fault == "reset":
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    self.connection.close()
                    self.close_connection = True
                    return
                if fault in ("503", "429"):
                    self._send(int(fault), b'{"error": "injected"}')
                    return
                if fault == "400ctx":
                    self._send(400, (FIX / "vllm_400_prompt_too_long.json").read_bytes())
                    return
                # only the generation requests count: the cap governs them, and a job's GET of /v1/models
                # (which engine serves the model, generation/jobs.py) may overlap three of them
                counted = method == "POST"
                with proxy.lock:
                    proxy.inflight += counted
                    proxy.max_concurrent = max(proxy.max_concurrent, proxy.inflight)
                try:
                    r = httpx.request(method, proxy.upstream + self.path, content=body,
                                      headers={"Content-Type": "application/json"}, timeout=600)
                finally:
                    with proxy.lock:
                        proxy.inflight -= counted
                self._send(r.status_code, r.content)

            def _send(self, code: int, data: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._relay("GET")

            def do_POST(self):
                self._relay("POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fault_proxy():
    made: list[FaultProxy] = []

    def make(upstream: str, faults: list[str]) -> FaultProxy:
        p = FaultProxy(upstream, faults)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()
