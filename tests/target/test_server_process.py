"""How a vLLM CPU server is started: the model runs in the engine process (vLLM's ``uni`` executor, which its CPU
platform allows only with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``) unless tensor parallelism or an executor is asked
for. The served behaviour is covered by every end-to-end test; here the command and environment, and one real
server's process tree (docs/benchmarks.md: one busy core per answering server instead of two)."""

from __future__ import annotations

import httpx
import psutil
import pytest
from draftsmith.target.server import VLLMServer, VLLMServerSpec, free_port


@pytest.mark.parametrize("extra, single", [
    ([], True),
    (["--tensor-parallel-size", "1"], True),
    (["--tensor-parallel-size", "2"], False),
    (["-tp", "2"], False),
    (["--tensor-parallel-size=2"], False),
    (["--distributed-executor-backend", "mp"], False),
])
def test_the_engine_process_runs_the_model_without_tensor_parallelism(tmp_path, monkeypatch, extra, single):
    # an in-process vLLM engine earlier in this process (the extraction backend) leaves the variable set
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    spec = VLLMServerSpec(model=tmp_path, extra_args=extra)
    cmd = spec.command()
    assert spec.single_process() is single
    flag = "--distributed-executor-backend"
    assert (flag in cmd and cmd[cmd.index(flag) + 1] == "uni") is single
    assert (spec.env().get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0") is single


@pytest.mark.slow
def test_a_real_server_has_no_worker_process_and_leaves_no_file_behind(embedded_target, tmp_path):
    """One busy engine process; vLLM's ZMQ socket files live in the server's own TMPDIR, gone after the stop
    (before, every server start left three socket files in /tmp)."""
    spec = VLLMServerSpec(model=embedded_target, served_name="m", port=free_port(), max_model_len=1024,
                          kv_cache_gib=1, enforce_eager=True)
    with VLLMServer(spec, tmp_path / "server.log").start(timeout_s=600) as server:
        r = httpx.post(server.url + "/v1/completions", json={"model": "m", "prompt": "1, 2, 3,", "max_tokens": 8,
                                                             "temperature": 0}, timeout=120)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8
        names = [p.name() for p in psutil.Process(server.proc.pid).children(recursive=True)]
        assert "VLLM::EngineCore" in names and not any("Worker" in n for n in names), names
        engine_tmp = server.tmp_dir
        sockets = [p for p in engine_tmp.iterdir() if p.is_socket()]
        assert sockets, list(engine_tmp.iterdir())  # the engine's ZMQ sockets went to its own folder
    assert not engine_tmp.exists() and server.tmp_dir is None
