"""`draftsmith eval` refuses bad input in one line (exit 2) before any engine starts."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

DRAFTSMITH = str(Path(sys.executable).parent / "draftsmith")


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([DRAFTSMITH, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_misfit_drafter_refused_before_engine(tmp_path, write_drafter, embedded_target):
    d = write_drafter(tmp_path / "d", layer_ids=(1, 14, 31))
    t0 = time.time()
    r = _run("eval", "--run", "x", "--drafter", str(d), "--url", "http://127.0.0.1:9", cwd=tmp_path)
    assert r.returncode == 2
    assert "layer ids [1, 14, 31] do not fit a target with 30 layers" in r.stderr
    assert time.time() - t0 < 60  # refused from config files, no server was started


def test_unknown_set_lists_known_ones(tmp_path, random_drafter):
    r = _run("eval", "--run", "x", "--drafter", str(random_drafter), "--sets", "gsm8k,mtbench", cwd=tmp_path)
    assert r.returncode == 2
    assert "unknown eval set 'mtbench'" in r.stderr and "mt_bench, gsm8k, humaneval, alpaca" in r.stderr


def test_missing_export_says_what_to_run(tmp_path):
    r = _run("eval", "--run", "nothing", cwd=tmp_path)
    assert r.returncode == 2 and "run `draftsmith export` first" in r.stderr


def test_print_sglang_command(tmp_path, random_drafter, embedded_target):
    r = _run("eval", "--drafter", str(random_drafter), "--k", "4", "--print-sglang-command", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "--speculative-algorithm EAGLE3" in r.stdout and "--speculative-num-draft-tokens 5" in r.stdout
    assert f"--speculative-draft-model-path {random_drafter}" in r.stdout


def test_speculators_layout_passes_the_checks(tmp_path, export_drafter):
    """`eval --drafter` on our own export/speculators gets past the drafter checks (it stops at the next check,
    an unknown set, so no engine starts)."""
    d = export_drafter(tmp_path / "export" / "speculators", "speculators")
    r = _run("eval", "--run", "x", "--drafter", str(d), "--sets", "nope", cwd=tmp_path)
    assert r.returncode == 2 and "unknown eval set 'nope'" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_folder_of_neither_layout_is_one_line(tmp_path, embedded_target):
    r = _run("eval", "--run", "x", "--drafter", str(embedded_target), cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = [x for x in r.stderr.splitlines() if "EAGLE-3" in x]
    assert len(lines) == 1, r.stderr
    assert f"{embedded_target} is not an EAGLE-3 drafter in either layout" in lines[0]
    assert "'architectures': ['LlamaForCausalLM']" in lines[0] and "pass a folder written by `draftsmith export`" in lines[0]


def test_sglang_is_not_handed_the_speculators_layout(tmp_path, export_drafter):
    d = export_drafter(tmp_path / "speculators", "speculators")
    r = _run("eval", "--drafter", str(d), "--print-sglang-command", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"SGLang loads EAGLE-3 drafters in the eagle3 layout only; {d} is speculators" in r.stderr


def test_sglang_through_the_stack_measures_the_running_target_by_url(tmp_path, random_drafter, fixtures_dir):
    """``make eval`` with ``EVAL_ENGINE=sglang`` runs ``draftsmith eval --engine sglang --url http://target:8000``:
    it measures that server, needs no SGLang in the evaluator and starts no baseline engine. SGLang cannot run here:
    the server replays SGLang's recorded ``/generate`` answer (meta_info of sglang PR 33518) and ``/metrics`` text
    (fixtures README)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    meta = json.loads((fixtures_dir / "sglang_meta_info_pr33518.json").read_text())
    metrics = (fixtures_dir / "sglang_metrics_docs.txt").read_text()  # SGLang's documented /metrics text
    seen = []

    class Replay(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, body))
            out = json.dumps({"text": "The answer is 5.", "meta_info": meta}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def do_GET(self):  # noqa: N802
            # SGLang answers /health with 200 once its model is loaded; eval waits for it
            out = metrics.encode() if self.path == "/metrics" else b"{}"
            self.send_response(200 if self.path in ("/metrics", "/health") else 404)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Replay)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        r = _run("eval", "--run", "x", "--drafter", str(random_drafter), "--engine", "sglang", "--k", "5",
                 "--url", f"http://127.0.0.1:{server.server_port}", "--sets", "gsm8k", "--limit", "2",
                 "--out", str(tmp_path / "eval"), cwd=tmp_path)
    finally:
        server.shutdown()
    assert r.returncode == 0, r.stderr[-2000:]
    assert seen and all(path == "/generate" for path, _ in seen)
    assert "<|im_start|>assistant" in seen[0][1]["text"]  # rendered with the target's own chat template
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    (result,) = report["results"]
    assert result["engine"] == "sglang" and result["overall"]["speedup"] is None
    assert result["overall"]["mean_acceptance_length"] == pytest.approx(meta["spec_accept_length"], abs=1e-3)
    assert "no SGLang baseline" in r.stderr
