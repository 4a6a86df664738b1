"""Every long-running command under SIGTERM and SIGINT, as real processes: the signal convention of docs/signals.md.

A service (``worker``, ``queue-exporter``, ``target serve``, ``gateway``, ``refresh``) exits 0; a batch command (``train``, ``extract
--sync``, ``eval``, ``demo``) prints one line ``stopped by SIG...; kept: ... -> run the same
command again to resume`` last and exits 128 + signal. Neither leaves a process behind: the command's descendants
are collected while it works and must all be gone once it exited.

SIGTERM goes to the command's process alone (``kill``, ``timeout``, ``docker stop``); SIGINT goes to its whole
process group (a terminal's Ctrl-C), so children get it too. Each command is started in a session of its own.
``target serve`` is stopped once, by SIGTERM once it answers: a real vLLM start costs about a minute here, and
SIGINT on a serving ``target serve`` is tests/generation/test_target_cli.py. ``train`` is stopped here by SIGINT;
SIGTERM, with the resume that follows, is tests/drafter/test_train_signals.py. ``self-prompts`` is not here: kept busy
for seconds (its default 32 seeded samples per request) it crashes vLLM CPU's engine ("CPU Generator does not use
offset"), which would take the session's shared server down; it stops through the same wrapper as ``eval``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from draftsmith.target.server import free_port

TESTS = Path(__file__).resolve().parents[1]
SIGNALS = [signal.SIGTERM, signal.SIGINT]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Command:
    """``draftsmith <args>`` in a session of its own, its output (stdout and stderr) collected line by line."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.args = args
        self.proc = subprocess.Popen([sys.executable, "-m", "draftsmith", *args], env={**os.environ, **env},
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True, preexec_fn=_sighup_default)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, text: str, timeout_s: float = 240.0, count: int = 1) -> None:
        """Wait until ``text`` appeared in ``count`` lines of the output; fail with the output if the command
        exited first or the time ran out."""
        deadline = time.time() + timeout_s
        while sum(text in line for line in list(self.lines)) < count:
            if self.proc.poll() is not None or time.time() > deadline:
                time.sleep(0.5)  # the last lines
                pytest.fail(f"`draftsmith {' '.join(self.args)}` never printed {text!r} (exit {self.proc.poll()}):\n"
                            f"{self.output[-4000:]}")
            time.sleep(0.1)

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)

    def stop(self, sig: signal.Signals, timeout_s: float = 180.0) -> tuple[int, list[psutil.Process]]:
        """Send ``sig`` (SIGINT to the process group, as a terminal does; else to the process) and wait for the
        exit; returns the exit code and the descendants collected just before the signal."""
        kids = self.descendants()
        if sig == signal.SIGINT:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"`draftsmith {' '.join(self.args)}` did not stop within {timeout_s:.0f} s of {sig.name}:\n"
                        f"{self.output[-4000:]}")
        self._reader.join(10)
        return code, kids

    def kill(self) -> None:
        """The test's own clean-up: SIGKILL the command, its descendants and its session."""
        for p in [*self.descendants(), psutil.Process(self.proc.pid)] if self.proc.poll() is None else []:
            p.kill()
        for p in _session(self.proc.pid):
            p.kill()


def _sighup_default() -> None:
    """Children start with SIGHUP at its default action even under ``nohup``."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _session(sid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid and _alive(p):
                out.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return out


def assert_stopped(cmd: Command, sig: signal.Signals, service: bool, kids: list[psutil.Process], code: int,
                   kept: str | None = None) -> None:
    """The convention: the exit code, the last line of a batch command, and no process left (the descendants
    collected before the signal, and anything else of the command's session)."""
    out = cmd.output
    try:
        left: list[psutil.Process] = []
        deadline = time.time() + 5  # a child told to stop may take a moment to be reaped by init
        while time.time() < deadline:
            left = [p for p in kids if _alive(p)] + _session(cmd.proc.pid)
            if not left:
                break
            time.sleep(0.2)
        assert not left, f"left running after {sig.name}: {[(p.pid, p.cmdline()) for p in left if _alive(p)]}"
        assert "Traceback" not in out, out[-4000:]
        if service:
            assert code == 0, out[-4000:]
            return
        assert code == 128 + sig, out[-4000:]
        last = out.strip().splitlines()[-1]
        assert last.startswith(f"stopped by {sig.name}"), out[-4000:]
        assert last.endswith(" -> run the same command again to resume") or "again to resume" in last, last
        if kept:
            assert f"; kept: {kept}" in last, last
    finally:
        cmd.kill()


@pytest.fixture(scope="module")
def env(tmp_path_factory, embedded_target) -> dict[str, str]:
    runs = tmp_path_factory.mktemp("signals") / "runs"
    return {"DRAFTSMITH_RUNS_DIR": str(runs), "DRAFTSMITH_TARGET__PATH": str(embedded_target),
            "DRAFTSMITH_METRICS__PORT": "0", "DRAFTSMITH_TARGET__KV_CACHE_GIB": "1"}


def test_every_command_is_wrapped_once():
    """The convention is applied in one place to every command the CLI has; the services named there exist."""
    from draftsmith.cli import COMMANDS, SERVICES, app
    from typer.main import get_command

    def walk(cmd, prefix: str = "") -> dict:  # the click commands typer builds, by their full names
        if hasattr(cmd, "commands"):
            return {k: v for name, sub in cmd.commands.items() for k, v in walk(sub, f"{prefix}{name} ").items()}
        return {prefix.strip(): cmd}

    commands = walk(get_command(app))
    assert sorted(commands) == sorted(COMMANDS) and len(COMMANDS) == len(set(COMMANDS))
    assert SERVICES <= set(commands)
    kinds = {name: getattr(cmd.callback, "signal_convention", None) for name, cmd in commands.items()}
    assert kinds == {name: "service" if name in SERVICES else "batch" for name in commands}
    assert {name for name, kind in kinds.items() if kind == "service"} == {"worker", "queue-exporter", "target serve",
                                                                          "gateway", "refresh"}


# ---- services


@pytest.mark.slow  # real commands, real models
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_queue_exporter(sig, env, redis_url):
    cmd = Command(["queue-exporter", "--port", "0", "--interval", "0.5"], {**env, "DRAFTSMITH_REDIS__URL": redis_url})
    cmd.wait_for("queue exporter: /metrics on port")
    code, kids = cmd.stop(sig)
    assert_stopped(cmd, sig, True, kids, code)
    assert cmd.lines[-1] == f"queue-exporter stopped by {sig.name}"


@pytest.mark.slow  # real commands, real models
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_gateway(sig, env, redis_url):
    """uvicorn catches the signal first and shuts its server down; the command still ends as a service does."""
    port = free_port()
    cmd = Command(["gateway", "--port", str(port), "--upstream", "http://127.0.0.1:9"],
                  {**env, "DRAFTSMITH_REDIS__URL": redis_url})
    cmd.wait_for(f"gateway on http://127.0.0.1:{port}")
    cmd.wait_for("Uvicorn running on")
    code, kids = cmd.stop(sig)
    assert_stopped(cmd, sig, True, kids, code)
    assert cmd.lines[-1] == f"gateway stopped by {sig.name}"


@pytest.mark.slow  # real commands, real models
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_refresh(sig, env, redis_url, tmp_path):
    """The watch loop between two checks of a served run (v1 on its routes, no traffic yet)."""
    import json

    import redis
    from draftsmith.paths import RunPaths
    from draftsmith.serving.routes import Routes, write_routes
    from draftsmith.serving.versions import add_version, write_serving

    paths = RunPaths(env["DRAFTSMITH_RUNS_DIR"], f"sig-{sig.name}")
    paths.root.mkdir(parents=True)
    export = tmp_path / "export"
    export.mkdir()
    (export / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    add_version(paths, export)
    write_serving(paths.root, "v1")
    write_routes(redis.Redis.from_url(redis_url), "dssig", paths.root.name, Routes(stable="http://127.0.0.1:9",
                                                                                   stable_drafter="v1"))
    cmd = Command(["refresh", "--run", paths.root.name, "--poll-s", "0.5"],
                  {**env, "DRAFTSMITH_REDIS__URL": redis_url, "DRAFTSMITH_REDIS__PREFIX": "dssig"})
    cmd.wait_for("no refresh: 0 new answered traffic records", count=2)
    code, kids = cmd.stop(sig)
    assert_stopped(cmd, sig, True, kids, code)
    assert cmd.lines[-1] == f"refresh stopped by {sig.name}"


@pytest.mark.slow  # real commands, real models
@pytest.mark.parametrize("queues", ["generate,extract", "extract"])  # forking workers; resident ones (extract only)
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_worker(sig, queues, env, redis_url):
    cmd = Command(["worker", "--processes", "2", "--queues", queues],
                  {**env, "DRAFTSMITH_REDIS__URL": redis_url, "DRAFTSMITH_REDIS__PREFIX": "dssig"})
    cmd.wait_for("Listening on", count=2)  # both rq workers are waiting for jobs
    time.sleep(1.0)  # past rq's start-up: a worker signalled before its handlers are in place stops late, with a traceback
    code, kids = cmd.stop(sig)
    assert len(kids) >= 2  # the two workers (and the scheduler child of the one holding the lock)
    assert_stopped(cmd, sig, True, kids, code)


@pytest.mark.slow  # real commands, real models
def test_target_serve(env):
    port = free_port()
    cmd = Command(["target", "serve", "--port", str(port), "--eager"], env)
    cmd.wait_for(f"target ready: http://127.0.0.1:{port}", timeout_s=420)
    code, kids = cmd.stop(signal.SIGTERM)
    assert len(kids) >= 2, "vLLM's API server and its engine core"
    assert_stopped(cmd, signal.SIGTERM, True, kids, code)
    assert "stopping vLLM (SIGTERM)..." in cmd.output


# ---- batch commands


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, embedded_target) -> Path:
    """The drafter tests' reference run (data/ and real SmolLM2 features) on 24 of its samples, built once here."""
    conf = _load("drafter_conftest", TESTS / "drafter" / "conftest.py")
    ref = _load("reference_run", TESTS / "drafter" / "reference_run.py")
    root = tmp_path_factory.mktemp("ref") / "ref"
    ref.write_reference_run(root, embedded_target, conf.fixture_samples(24), conf.LAYER_IDS, conf.VOCAB)
    return root


def _copy_run(reference_run: Path, env: dict[str, str], name: str) -> Path:
    dst = Path(env["DRAFTSMITH_RUNS_DIR"]) / name
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(reference_run, dst)
    return dst


@pytest.mark.slow  # real commands, real models
@pytest.mark.parametrize("sig", [signal.SIGINT], ids=lambda s: s.name)  # SIGTERM: tests/drafter/test_train_signals.py
def test_train(sig, env, reference_run):
    run = f"train-{sig.name}"
    root = _copy_run(reference_run, env, run)
    cmd = Command(["train", "--run", run, "--max-steps", "500", "--ttt-steps", "2"],
                  {**env, "DRAFTSMITH_DATA__DRAFT_VOCAB_SIZE": "2048", "DRAFTSMITH_TRAIN__BATCH_TOKENS": "640",
                   "DRAFTSMITH_TRAIN__BATCH_SIZE": "4", "DRAFTSMITH_TRAIN__LOG_EVERY": "1",
                   "DRAFTSMITH_TRAIN__EVAL_EVERY": "1000"})
    cmd.wait_for("step       2/500")
    code, kids = cmd.stop(sig)
    assert_stopped(cmd, sig, False, kids, code, kept="checkpoint step-")
    last = cmd.lines[-1]
    assert f"in {root / 'checkpoints'} -> run `draftsmith train --run {run}` again to resume from it" in last
    assert list((root / "checkpoints").glob("step-*"))


@pytest.mark.slow  # real commands, real models
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_extract_sync(sig, env, reference_run):
    run = f"extract-{sig.name}"
    root = _copy_run(reference_run, env, run)
    shutil.rmtree(root / "features")
    cmd = Command(["--log-level", "DEBUG", "extract", "--run", run, "--sync", "--backend", "hf"], env)
    cmd.wait_for(f"/{run}: backend hf")  # the plan line names the run's folder and the backend
    time.sleep(1.0)  # the target is loading or extracting
    code, kids = cmd.stop(sig)
    assert_stopped(cmd, sig, False, kids, code, kept=f"the finished feature shards in {root / 'features'}")


@pytest.fixture(scope="module")
def drafter(tmp_path_factory, embedded_target) -> Path:
    """A random EAGLE-3 drafter that fits the embedded target (the evaluator tests' own)."""
    rec = _load("record_vllm_spec", TESTS / "fixtures" / "evaluation" / "record_vllm_spec.py")
    return rec.write_random_drafter(embedded_target, tmp_path_factory.mktemp("drafter") / "drafter")


@pytest.mark.slow  # real commands, real models
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_eval(sig, env, drafter, vllm_server):
    """``eval --url``: the server is the shared one (no drafter loaded), enough to keep eval sending requests."""
    cmd = Command(["eval", "--run", "ev", "--url", vllm_server, "--drafter", str(drafter), "--no-baseline",
                   "--sets", "gsm8k", "--limit", "10", "--concurrency", "1", "--max-tokens", "64"], env)
    cmd.wait_for("fits")
    time.sleep(2.0)  # requests in flight
    code, kids = cmd.stop(sig)
    assert_stopped(cmd, sig, False, kids, code, kept="the reports already in ")


@pytest.mark.slow  # real commands, real models
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_demo(sig, env):
    """The demo stopped while its vLLM server starts: the server (its own session) goes with it."""
    run = f"demo-{sig.name}"
    cmd = Command(["demo", "--run", run, "--size", "small"], env)
    cmd.wait_for("== serve: start")
    deadline = time.time() + 60
    while not any("vllm" in " ".join(p.cmdline()) for p in cmd.descendants() if _alive(p)):
        assert time.time() < deadline and cmd.proc.poll() is None, cmd.output[-3000:]
        time.sleep(0.2)
    time.sleep(2.0)
    code, kids = cmd.stop(sig)
    root = Path(env["DRAFTSMITH_RUNS_DIR"]) / run
    assert_stopped(cmd, sig, False, kids, code, kept=f"the finished stages in {root} (demo.json)")
