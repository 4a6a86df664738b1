"""`make up && make eval`: the evaluator waits for the target it measures to answer /health (a real HTTP server
that answers 503 while "loading", then 200), and says how long it waited for when it gives up."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from draftsmith.errors import EngineError
from draftsmith.evaluation.evaluate import wait_for_engine


def _server(codes: list[int]) -> ThreadingHTTPServer:
    """A server whose /health answers ``codes`` in turn, then the last one forever."""
    seen = []

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            seen.append(self.path)
            self.send_response(codes[min(len(seen), len(codes)) - 1])
            self.end_headers()

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    srv.seen = seen
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_the_evaluator_waits_for_a_loading_target():
    srv = _server([503, 503, 200])
    try:
        wait_for_engine(f"http://127.0.0.1:{srv.server_port}", timeout_s=10, every_s=0.05)
        assert srv.seen == ["/health"] * 3
    finally:
        srv.shutdown()


def test_a_target_that_never_answers_is_named_with_the_wait_and_the_last_answer():
    srv = _server([503])
    try:
        with pytest.raises(
            EngineError, match=r"did not answer /health within 0 s \(HTTP 503\).*startup_timeout_s"
        ):
            wait_for_engine(f"http://127.0.0.1:{srv.server_port}", timeout_s=0.2, every_s=0.05)
    finally:
        srv.shutdown()
