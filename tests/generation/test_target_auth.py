"""A wrong API key is reported as a 401 with the fix, not as a server that does not answer.

The refusing server is a small local HTTP server that answers what vLLM's API-key middleware answers
(``401 {"error": "Unauthorized"}`` for every ``/v1`` path when ``--api-key`` is set and the bearer differs); a vLLM
server of its own just for this would cost minutes of CPU on the shared machine.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from draftsmith.errors import TargetAuthError
from draftsmith.target.server import resolve_model

KEY = "right-key-123"


@pytest.fixture
def keyed_server():
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            ok = self.headers.get("Authorization") == f"Bearer {KEY}"
            body = json.dumps({"data": [{"id": "m"}]} if ok else {"error": "Unauthorized"}).encode()
            self.send_response(200 if ok else 401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_wrong_key_says_401_and_check_the_key(keyed_server):
    with pytest.raises(TargetAuthError) as ei:
        resolve_model(keyed_server, None, "wrong-key-456")
    msg = str(ei.value)
    assert "HTTP 401" in msg and "check the key" in msg and "API_KEY" in msg
    assert "does not answer" not in msg and "wrong-key-456" not in msg


def test_missing_key_says_none_was_given(keyed_server):
    with pytest.raises(TargetAuthError, match="no API key was given"):
        resolve_model(keyed_server, None, None)


def test_right_key_resolves(keyed_server):
    assert resolve_model(keyed_server, None, KEY) == "m"
