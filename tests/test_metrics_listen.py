"""Where draftsmith's own ``/metrics`` listens: this host only unless ``metrics.addr`` says otherwise, and a taken
port is one clear error (the services stop with it; ``train`` warns and goes on: tests/drafter/test_train_cli.py)."""

from __future__ import annotations

import socket

import httpx
import psutil
import pytest
from draftsmith.config import load_settings
from draftsmith.errors import DraftsmithError
from draftsmith.metrics import serve_metrics
from draftsmith.target.server import free_port


def listening(port: int) -> set[str]:
    """Addresses this process listens on at ``port``."""
    return {c.laddr.ip for c in psutil.Process().net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def test_metrics_bind_loopback_unless_the_setting_says_otherwise(monkeypatch):
    s = load_settings()
    assert s.metrics.addr == "127.0.0.1"
    port = free_port()
    serve_metrics(port, s.metrics.addr)
    assert listening(port) == {"127.0.0.1"}
    assert "python_info" in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text

    monkeypatch.setenv("DRAFTSMITH_METRICS__ADDR", "0.0.0.0")  # what compose sets inside its containers
    port = free_port()
    serve_metrics(port, load_settings().metrics.addr)
    assert listening(port) == {"0.0.0.0"}


def test_a_taken_port_is_one_error_naming_it_and_the_setting():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(DraftsmithError) as e:
            serve_metrics(port, "127.0.0.1")
    assert f"cannot serve /metrics on 127.0.0.1:{port}" in str(e.value) and "metrics.port" in str(e.value)
