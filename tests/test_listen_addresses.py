"""Every server draftsmith starts listens on this host only unless told otherwise; compose says 0.0.0.0 inside its
containers (``DRAFTSMITH_METRICS__ADDR``), where Compose publishes the ports on 127.0.0.1.

Real processes for the worker pool's and the queue exporter's ``/metrics``; ``draftsmith target serve`` is checked
with a real vLLM in tests/generation/test_target_cli.py and ``train``'s ``/metrics`` in
tests/drafter/test_train_cli.py; the evaluator's and the demo's vLLM servers are built from the same
``VLLMServerSpec`` (checked here by their command lines, without a server).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from draftsmith.target.server import free_port

REPO = Path(__file__).resolve().parents[1]


def tree_listening(pid: int, port: int, timeout: float = 60) -> set[str]:
    """Addresses that process ``pid`` or one of its descendants listens on at ``port`` (waits until one does)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        addrs = set()
        for p in procs:
            try:
                addrs |= {c.laddr.ip for c in p.net_connections(kind="tcp")
                          if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
            except psutil.NoSuchProcess:
                continue
        if addrs:
            return addrs
        time.sleep(0.2)
    return set()


@pytest.mark.parametrize("command", ["worker", "queue-exporter"])
@pytest.mark.parametrize("addr", [None, "0.0.0.0"])
def test_services_metrics_listen_on_loopback_unless_told(command, addr, redis_url, tmp_path):
    port = free_port()
    env = {**os.environ, "DRAFTSMITH_REDIS__URL": redis_url, "DRAFTSMITH_REDIS__PREFIX": "dslisten",
           "DRAFTSMITH_RUNS_DIR": str(tmp_path)}
    env.pop("DRAFTSMITH_METRICS__ADDR", None)
    if addr:
        env["DRAFTSMITH_METRICS__ADDR"] = addr  # what compose.yaml sets for its containers
    args = {"worker": ["worker", "--processes", "1", "--metrics-port", str(port)],
            "queue-exporter": ["queue-exporter", "--port", str(port)]}[command]
    p = subprocess.Popen([sys.executable, "-m", "draftsmith", *args], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        bound = tree_listening(p.pid, port)
    finally:
        p.terminate()
        out = p.communicate(timeout=60)[0]
    assert bound == {addr or "127.0.0.1"}, out[-2000:]


def test_evaluator_and_demo_servers_are_built_for_loopback(monkeypatch, tmp_path, embedded_target):
    from draftsmith.config import load_settings
    from draftsmith.evaluation import evaluate
    from draftsmith.target import server

    specs = []
    monkeypatch.setattr(server.VLLMServer, "start", lambda self, timeout_s=None: specs.append(self.spec) or self)
    evaluate._vllm_server(load_settings(), embedded_target, None, tmp_path / "log")
    assert len(specs) == 1 and specs[0].host == "127.0.0.1"
    cmd = specs[0].command()
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    demo = (REPO / "shared" / "draftsmith" / "demo.py").read_text()
    assert "VLLMServerSpec(" in demo and "host=" not in demo  # the demo's server takes the loopback default
