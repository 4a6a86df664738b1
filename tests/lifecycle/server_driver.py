"""A process that starts a server through draftsmith's VLLMServer and then waits, to be signalled by the tests.

``python server_driver.py PORT MODE [LOG]``: MODE ``stub`` serves ``/v1/models`` from a tiny HTTP server (the
process tree and signal paths are VLLMServer's own; only the served program is small), ``stub-slow`` never becomes
ready (interrupted while starting). Prints ``READY <pgid>`` or ``STARTED <pgid>`` and sleeps.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from draftsmith.target.server import VLLMServer, cpu_env

STUB = r"""
import http.server, sys, time
if sys.argv[2] == "slow":
    time.sleep(3600)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Type", "application/json"); self.end_headers()
        self.wfile.write(b'{"data": [{"id": "stub"}]}')
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


@dataclass
class StubSpec:
    port: int
    slow: bool
    kv_cache_gib: int = 1
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def env(self) -> dict[str, str]:
        return cpu_env(kv_cache_gib=self.kv_cache_gib)

    def command(self) -> list[str]:
        return [sys.executable, "-c", STUB, str(self.port), "slow" if self.slow else "fast"]


def main() -> None:
    port, mode = int(sys.argv[1]), sys.argv[2]
    log = Path(sys.argv[3]) if len(sys.argv) > 3 else Path("/tmp") / f"driver-{port}.log"
    server = VLLMServer(StubSpec(port, slow=mode == "stub-slow"), log)

    def announce() -> None:  # the pgid is known as soon as Popen returned
        while server.proc is None:
            time.sleep(0.05)
        print(f"STARTED {server.proc.pid}", flush=True)

    threading.Thread(target=announce, daemon=True).start()
    with server.start(timeout_s=3600):
        print(f"READY {server.proc.pid}", flush=True)
        while True:
            time.sleep(0.2)


if __name__ == "__main__":
    main()
