"""The session's shared server (tests/shared_server.py) survives a test that kills it: the next test
that asks for it gets a running one again. Checked with a real process (Python's http.server) in place of vLLM."""

from __future__ import annotations

import signal
import subprocess
import sys

import httpx
from draftsmith.target.server import free_port
from shared_server import SharedServer


class HTTPServer:
    """A real server process with the interface SharedServer needs (url, proc, stop)."""

    def __init__(self) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                httpx.get(self.url, timeout=1)
                break
            except httpx.HTTPError:
                self.proc.poll()
        self.stopped = False

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.stopped = True


def test_a_killed_shared_server_is_started_again_for_the_next_test():
    shared = SharedServer(HTTPServer)
    url = shared.url()
    assert shared.url() == url and shared.starts == 1  # one start for every user while it runs
    first = shared.server
    first.proc.send_signal(signal.SIGKILL)  # a test crashes the server
    first.proc.wait()
    url2 = shared.url()
    assert shared.starts == 2 and first.stopped and first.proc.returncode == -signal.SIGKILL
    assert httpx.get(url2, timeout=5).status_code == 200 and shared.server.proc.poll() is None
    shared.stop()
    assert shared.server is None and shared.starts == 2
