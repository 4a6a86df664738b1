"""A command that started a server stops it on SIGTERM, SIGINT and SIGHUP: real processes, real signals.

``server_driver.py`` starts a server through :class:`draftsmith.target.server.VLLMServer` (the class every command
uses: eval, target serve, the demo, the SGLang evaluator) with a tiny HTTP program instead of vLLM, so the fast tests
take seconds; ``test_target_serve_sigterm_stops_real_vllm`` does the same to ``draftsmith target serve`` with the
real vLLM CPU server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from draftsmith.target.server import free_port

DRIVER = Path(__file__).with_name("server_driver.py")



def _sighup_default() -> None:
    """Children start with SIGHUP at its default action even under ``nohup`` (which sets it to ignored, and a
    command rightly keeps an ignored SIGHUP): the tests send SIGHUP and expect it to be handled."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)

def _pgid_alive(pgid: int) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return out


def _start(mode: str, tmp_path: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen(preexec_fn=_sighup_default, args=[sys.executable, str(DRIVER), str(port), mode, str(tmp_path / "server.log")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    want = "READY" if mode == "stub" else "STARTED"
    line = ""
    deadline = time.time() + 60
    while time.time() < deadline:
        line = proc.stdout.readline()
        if line.startswith(want):
            break
    assert line.startswith(want), line
    return proc, int(line.split()[1])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
@pytest.mark.parametrize("mode", ["stub", "stub-slow"])
def test_signal_stops_the_server_the_process_started(sig, mode, tmp_path):
    """`stub`: the server answers and the command works with it; `stub-slow`: the signal comes while it starts."""
    proc, pgid = _start(mode, tmp_path)
    assert _pgid_alive(pgid), "the server must be running before the signal"
    proc.send_signal(sig)
    proc.wait(60)
    try:
        assert _pgid_alive(pgid) == [], f"server left running after {sig.name} ({mode})"
    finally:
        for pid in _pgid_alive(pgid):
            os.kill(pid, signal.SIGKILL)


def test_sigterm_handler_keeps_a_handler_someone_else_installed():
    code = (
        "import signal; from draftsmith.signals import raise_on_sigterm\n"
        "mine = lambda *a: None\n"
        "signal.signal(signal.SIGTERM, mine)\n"
        "print(raise_on_sigterm(), signal.getsignal(signal.SIGTERM) is mine)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True"]


@pytest.mark.slow
def test_target_serve_sigterm_stops_real_vllm(embedded_target, tmp_path):
    """`draftsmith target serve` under SIGTERM (`timeout`, `docker stop`) while vLLM starts: nothing is left, a
    normal stop for this command (exit 0, like Ctrl-C). The signal comes once vLLM's engine process exists, not
    after it answers (about 30 s instead of minutes)."""
    port = free_port()
    env = {**os.environ, "DRAFTSMITH_RUNS_DIR": str(tmp_path / "runs"), "DRAFTSMITH_TARGET__KV_CACHE_GIB": "1",
           "DRAFTSMITH_TARGET__PATH": str(embedded_target)}
    proc = subprocess.Popen(preexec_fn=_sighup_default, args=[sys.executable, "-m", "draftsmith", "target", "serve", "--port", str(port), "--eager"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    me = psutil.Process(proc.pid)
    server = None
    deadline = time.time() + 240
    while time.time() < deadline and server is None:  # vLLM's api server and its EngineCore child
        kids = me.children(recursive=True)
        if any(len(k.children()) for k in kids):
            server = kids[0]
        time.sleep(0.5)
    assert server is not None, "vLLM did not start its engine process"
    pgid = os.getpgid(server.pid)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    try:
        assert _pgid_alive(pgid) == []
        assert proc.returncode == 0, err[-2000:]
        assert out.strip().splitlines()[-1] == "stopping vLLM (SIGTERM)..." and "Traceback" not in err
    finally:
        for pid in _pgid_alive(pgid):
            os.kill(pid, signal.SIGKILL)
