"""`draftsmith target prepare` is idempotent and `draftsmith target serve` starts the real vLLM CPU server, prints
its URL once it answers, and stops cleanly on Ctrl-C (SIGINT), freeing its port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import psutil
import pytest
from draftsmith.target.server import free_port


def test_prepare_is_idempotent(embedded_target, cache_dir):
    env = {**os.environ, "DRAFTSMITH_TARGET__CACHE_DIR": str(cache_dir)}
    before = (embedded_target / "model.safetensors").stat().st_mtime
    p = subprocess.run([sys.executable, "-m", "draftsmith", "target", "prepare"], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == str(embedded_target)
    assert (embedded_target / "model.safetensors").stat().st_mtime == before  # nothing rebuilt
    assert (embedded_target / "chat_template.jinja").is_file() and (embedded_target / "tokenizer.json").is_file()


@pytest.mark.e2e
def test_serve_answers_then_stops_on_ctrl_c(embedded_target, cache_dir, tmp_path):
    port = free_port()
    env = {**os.environ, "DRAFTSMITH_TARGET__CACHE_DIR": str(cache_dir), "DRAFTSMITH_RUNS_DIR": str(tmp_path),
           "DRAFTSMITH_TARGET__MAX_MODEL_LEN": "1024", "DRAFTSMITH_TARGET__KV_CACHE_GIB": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "draftsmith", "target", "serve", "--port", str(port), "--eager"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[str] = []
    try:
        t0 = time.time()
        while time.time() - t0 < 600:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            lines.append(line)
            if line.startswith("target ready:"):
                break
        assert lines and lines[-1].startswith(f"target ready: http://127.0.0.1:{port}"), "".join(lines[-20:])
        bound = {c.laddr.ip for p in psutil.Process(proc.pid).children(recursive=True)
                 for c in p.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
        assert bound == {"127.0.0.1"}  # this host only, unless --host says otherwise
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120, json={
            "model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "Say hi."}],
            "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        kids = psutil.Process(proc.pid).children(recursive=True)  # vLLM's API server and engine core
        assert len(kids) >= 2
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
        assert proc.wait(120) == 0  # a service: a signal is its normal end (docs/signals.md)
        assert psutil.wait_procs(kids, timeout=5)[1] == []  # nothing of vLLM is left
    finally:
        if proc.poll() is None:  # the test failed: vLLM runs in a session of its own, so kill the tree, not the group
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
            os.killpg(proc.pid, signal.SIGKILL)
    with socket.socket() as s:  # the server is gone and its port is free again
        s.bind(("127.0.0.1", port))
    assert (tmp_path / "logs" / f"vllm-{port}.log").is_file()
