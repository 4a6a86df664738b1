"""Start vLLM's CPU build as an OpenAI-compatible server, wait until it answers, stop it cleanly.

On the GPU host the target is the official vLLM or SGLang server (``compose.yaml``); this module is the embedded
CPU default, also used by the evaluator to start the target with a drafter. CPU settings measured on 2-core
x86 machines (``docs/benchmarks.md``): bind OpenMP to every core, reserve none, preload Intel OpenMP,
serve in float32 (no native bf16 arithmetic here), run the model in the engine process (one busy core per
answering server, not two: :meth:`VLLMServerSpec.single_process`).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from draftsmith.config import secret_value
from draftsmith.errors import EngineError, ModelNotServed, TargetAuthError, TargetUnavailable
from draftsmith.log import get_logger
from draftsmith.signals import raise_on_sigterm
from draftsmith.target.checkpoint import read_target_config, target_config_path
from draftsmith.target.engine_process import engine_tmp_env, group_alive

log = get_logger(__name__)


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_env(base: dict[str, str] | None = None, kv_cache_gib: int = 2) -> dict[str, str]:
    """Environment for vLLM's CPU build: all cores for compute, Intel OpenMP preloaded when present."""
    env = dict(os.environ if base is None else base)
    ncpu = os.cpu_count() or 1
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{ncpu - 1}" if ncpu > 1 else "0")
    env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    iomp = Path(sys.prefix) / "lib" / "libiomp5.so"
    if iomp.is_file() and "libiomp5" not in env.get("LD_PRELOAD", ""):
        env["LD_PRELOAD"] = ":".join(p for p in (str(iomp), env.get("LD_PRELOAD", "")) if p)
    return env


def target_uses_mla(model: Path) -> bool:
    """True when the checkpoint at ``model`` uses multi-head latent attention (``kv_lora_rank`` in its config)."""
    if not target_config_path(model).is_file():
        return False
    return read_target_config(model, text=True).get("kv_lora_rank") is not None


def needs_reference_mla(model: Path, dtype: str) -> bool:
    """True when vLLM's CPU build must be told to serve the MLA target at ``model`` with its reference ``CPU_MLA``
    attention (``--attention-backend CPU_MLA``, or ``attention_backend="CPU_MLA"`` for an in-process engine).

    vllm-cpu 0.32 picks ``AMX_MLA`` on every x86 CPU with AMX tiles (``vllm/platforms/cpu.py``); its
    ``process_weights_after_loading`` packs weights that must be bf16, fp16, int8, fp8 or 4-bit, so a float32 MLA
    target dies at start-up with "expect weight to be bfloat16, float16, int8, fp8_e4m3 or uint8" (found on an
    Intel Xeon with AMX, docs/mla.md). ``CPU_MLA`` is what vLLM already selects on CPUs without AMX, so pinning
    it serves the same attention on both kinds of CPU. A bf16 or fp16 target is left to vLLM's own choice. Only for
    vLLM's CPU build: GPU backends are never pinned.
    """
    return dtype in ("float32", "float") and target_uses_mla(model)


def eagle3_config(drafter: Path | str, k: int) -> dict:
    """vLLM's ``--speculative-config`` for the EAGLE-3 drafter folder ``drafter`` proposing a chain of ``k`` tokens.

    ``services/target/vllm-serve.sh`` writes the same JSON in the official image, which has no draftsmith to call;
    ``tests/stack/test_compose.py`` checks that the two agree."""
    return {"method": "eagle3", "model": str(drafter), "num_speculative_tokens": k}


@dataclass
class VLLMServerSpec:
    """What to serve and how. ``speculative`` is vLLM's ``--speculative-config`` dict (e.g. an EAGLE-3 drafter)."""

    model: Path
    served_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    dtype: str = "auto"  # resolved by draftsmith.precision.serving_dtype when the command is built
    max_model_len: int = 4096
    kv_cache_gib: int = 2
    enforce_eager: bool = False
    speculative: dict | None = None
    max_num_seqs: int | None = None
    extra_args: list[str] = field(default_factory=list)
    trust_remote_code: bool = False
    url_host: str | None = None  # the name others reach it by when ``host`` is a bind-all address (0.0.0.0)

    @property
    def url(self) -> str:
        return f"http://{self.url_host or self.host}:{self.port}"

    def command(self) -> list[str]:
        """The server command line (``python -m vllm.entrypoints.openai.api_server``: the console script of the
        ``vllm-cpu`` distribution fails with ``PackageNotFoundError: vllm``). A drafter on an MLA target starts
        through :mod:`draftsmith.target.vllm_launch` instead (vLLM CPU's block-size conflict, docs/mla.md)."""
        from draftsmith.precision import serving_dtype  # imports torch: only where a server is started
        entry = "draftsmith.target.vllm_launch" if self.speculative and target_uses_mla(self.model) else \
            "vllm.entrypoints.openai.api_server"
        cmd = [
            sys.executable, "-m", entry,
            "--model", str(self.model),
            "--host", self.host, "--port", str(self.port),
            "--dtype", serving_dtype(self.dtype),
            "--max-model-len", str(self.max_model_len),
            "--disable-uvicorn-access-log",
        ]
        if self.served_name:
            cmd += ["--served-model-name", self.served_name]
        if self.enforce_eager:
            cmd.append("--enforce-eager")
        if self.trust_remote_code:
            cmd.append("--trust-remote-code")
        if self.max_num_seqs:
            cmd += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.speculative:
            cmd += ["--speculative-config", json.dumps(self.speculative)]
        if self.needs_reference_mla():
            cmd += ["--attention-backend", "CPU_MLA"]
        if self.single_process():
            cmd += ["--distributed-executor-backend", "uni"]
        return cmd + list(self.extra_args)

    def single_process(self) -> bool:
        """True when the model runs inside vLLM's engine process (its ``uni`` executor, with
        ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` in :meth:`env`): no tensor parallelism and no executor in
        ``extra_args``.

        Why: vLLM's CPU build otherwise runs the model in a worker process of its own, and the engine process waits
        for each step's result by spinning on a shared-memory queue (``sched_yield`` for 1 s after every read), so an
        answering server kept two cores busy for one core's work. Measured on a 2-core EPYC with the embedded target
        (20 greedy answers of 64 tokens, eager, one OpenMP thread): 20.7 tok/s on 121 CPU-seconds per 62 s with the
        worker process, 21.2 tok/s on 61 CPU-seconds per 60 s in one process; ready in 26 s instead of 46
        (docs/benchmarks.md)."""
        args = list(self.extra_args)
        for flag in ("--tensor-parallel-size", "-tp"):
            if flag in args and args.index(flag) + 1 < len(args) and args[args.index(flag) + 1] != "1":
                return False
        return not any(a.startswith(("--distributed-executor-backend", "--tensor-parallel-size=")) for a in args)

    def env(self) -> dict[str, str]:
        """The server's environment: :func:`cpu_env`, and the engine in one process when :meth:`single_process`."""
        env = cpu_env(kv_cache_gib=self.kv_cache_gib)
        if self.single_process():
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # vLLM's CPU platform turns `uni` into `mp` without it
        return env

    def needs_reference_mla(self) -> bool:
        """:func:`needs_reference_mla` for this server; an ``--attention-backend`` in ``extra_args`` wins."""
        from draftsmith.precision import serving_dtype

        if not needs_reference_mla(self.model, serving_dtype(self.dtype)):
            return False
        return not any(a == "--attention-backend" or a.startswith("--attention-backend=") for a in self.extra_args)


_LIVE: set[VLLMServer] = set()  # servers started by this process and not yet stopped


def stop_all_servers() -> None:
    """Stop every server this process started and has not stopped (``atexit``; the last net under
    :meth:`VLLMServer.start`'s own clean-up)."""
    for server in list(_LIVE):
        server.stop(grace_s=10.0)


atexit.register(stop_all_servers)


class VLLMServer:
    """A vLLM CPU server in a child process group; a context manager that stops it on exit.

    ``spec`` is a :class:`VLLMServerSpec` or anything with its ``command()``, ``env()`` and ``url`` (the SGLang
    evaluator's :class:`draftsmith.evaluation.sglang.SGLangServerSpec` is started the same way).

    The server runs in a process group of its own (a Ctrl-C in the terminal reaches only draftsmith, which then
    stops it in order), so the parent must stop it on every way out: :meth:`start` makes SIGTERM and SIGHUP raise
    :class:`draftsmith.signals.Terminated` (a ``KeyboardInterrupt``) so ``with`` blocks and ``finally`` run, stops
    the server itself when interrupted while it waits, and an ``atexit`` hook stops whatever is still running.
    ``eval``, ``target serve``, the demo and the SGLang evaluator all start servers through this class.

    Raises (from :meth:`start`):
        EngineError: the process exited or did not answer within ``timeout_s``; the message carries its log tail.
    """

    def __init__(self, spec: VLLMServerSpec, log_path: Path) -> None:
        self.spec = spec
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen | None = None
        self.tmp_dir: Path | None = None  # the engine's TMPDIR while it runs (engine_tmp_env)

    @property
    def url(self) -> str:
        return self.spec.url

    def start(self, timeout_s: float = 900.0, progress_every_s: float = 10.0) -> VLLMServer:
        """Start the server and block until ``/v1/models`` answers (logging every ``progress_every_s``)."""
        raise_on_sigterm()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = self.spec.command()
        log.info("starting vLLM: %s", " ".join(cmd[1:]))
        logf = open(self.log_path, "ab")
        self.tmp_dir = Path(tempfile.mkdtemp(prefix="draftsmith-engine-"))
        self.proc = subprocess.Popen(
            cmd, stdout=logf, stderr=subprocess.STDOUT, env=engine_tmp_env(self.spec.env(), self.tmp_dir),
            start_new_session=True,
        )
        logf.close()
        _LIVE.add(self)
        try:
            return self._wait_ready(timeout_s, progress_every_s)
        except BaseException:  # interrupted, or failed to start: no `with` block holds it yet
            self.stop()
            raise

    def _wait_ready(self, timeout_s: float, progress_every_s: float) -> VLLMServer:
        assert self.proc is not None
        t0 = time.time()
        next_note = t0 + progress_every_s
        while True:
            if self.proc.poll() is not None:
                raise EngineError(
                    f"vLLM exited with code {self.proc.returncode} while starting; log tail:\n{self.log_tail()}",
                    f"see {self.log_path}",
                )
            if wait_ready(self.url, timeout_s=0.0):
                log.info("vLLM ready at %s after %.0f s", self.url, time.time() - t0)
                return self
            if time.time() - t0 > timeout_s:
                tail = self.log_tail()
                self.stop()
                raise EngineError(
                    f"vLLM did not answer at {self.url} within {timeout_s:.0f} s; log tail:\n{tail}",
                    f"see {self.log_path}",
                )
            if time.time() >= next_note:
                log.info("waiting for vLLM (%.0f s): %s", time.time() - t0, self.last_log_line())
                next_note += progress_every_s
            time.sleep(1.0)

    def log_tail(self, lines: int = 25) -> str:
        """Last ``lines`` lines of the server log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def last_log_line(self) -> str:
        tail = self.log_tail(1).strip()
        return tail[-160:]

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGINT the process group, then SIGTERM, then SIGKILL, until the server and every process of its group
        (vLLM's engine core) are gone; an interruption while waiting (a second Ctrl-C) kills the group at once,
        then propagates. Then its temporary folder goes (the engine's ZMQ socket files: a killed engine core never
        unlinks them)."""
        try:
            self._stop_group(grace_s)
        finally:
            if self.tmp_dir is not None and (self.proc is None or not group_alive(self.proc.pid)):
                shutil.rmtree(self.tmp_dir, ignore_errors=True)
                self.tmp_dir = None

    def _stop_group(self, grace_s: float) -> None:
        _LIVE.discard(self)
        if self.proc is None or (self.proc.poll() is not None and not group_alive(self.proc.pid)):
            return
        for sig, wait in ((signal.SIGINT, grace_s), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self._wait_group(wait)
                return
            except subprocess.TimeoutExpired:
                continue
            except BaseException:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(5.0)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass
                raise

    def _wait_group(self, timeout_s: float) -> None:
        """Wait for the server and then its whole process group: the engine core outlives the API server by a
        moment, and a command that returned before it is gone would leave it behind.

        Raises:
            subprocess.TimeoutExpired: something of the group still runs after ``timeout_s``.
        """
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        self.proc.wait(timeout_s)
        while group_alive(self.proc.pid):
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.spec.command(), timeout_s)
            time.sleep(0.1)

    def __enter__(self) -> VLLMServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def auth_headers(api_key) -> dict[str, str]:
    """``Authorization: Bearer`` for an API key given as ``SecretStr`` (``target.api_key``), a string, or None."""
    key = secret_value(api_key)
    return {"Authorization": f"Bearer {key}"} if key else {}


def wait_ready(url: str, timeout_s: float = 0.0, api_key: str | None = None) -> bool:
    """True once ``GET {url}/v1/models`` answers 200; polls for up to ``timeout_s`` seconds."""
    deadline = time.time() + timeout_s
    headers = auth_headers(api_key)
    while True:
        try:
            if httpx.get(f"{url.rstrip('/')}/v1/models", timeout=2.0, headers=headers).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        if time.time() >= deadline:
            return False
        time.sleep(0.5)


def models_served(url: str, api_key: str | None = None, timeout_s: float = 5.0) -> list[dict]:
    """The entries of the server's ``GET /v1/models`` (``id``, and ``max_model_len`` from vLLM and SGLang).

    Raises:
        TargetAuthError: the server answers 401/403 (wrong or missing API key; the key itself is never printed).
        TargetUnavailable: nothing answers at ``url``.
    """
    headers = auth_headers(api_key)
    try:
        r = httpx.get(f"{url.rstrip('/')}/v1/models", timeout=timeout_s, headers=headers)
        if r.status_code in (401, 403):
            given = "the API key given was refused" if api_key else "no API key was given"
            raise TargetAuthError(
                f"the target server at {url} answers HTTP {r.status_code} ({given})",
                "check the key: set DRAFTSMITH_TARGET__API_KEY (target.api_key) to the key the server was started with",
            )
        r.raise_for_status()
        entries = r.json().get("data", [])
        if not all(isinstance(m, dict) and "id" in m for m in entries):
            raise ValueError("an entry of /v1/models names no model id")
        return entries
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        raise TargetUnavailable(
            f"the target server at {url} does not answer ({type(e).__name__}: {e})",
            "start it (`draftsmith target serve`, or `make up` on the GPU host) or pass the right --url",
        ) from e


def served_models(url: str, api_key: str | None = None, timeout_s: float = 5.0) -> list[str]:
    """Model names the server serves (``GET /v1/models``).

    Raises:
        TargetAuthError: the server answers 401/403 (wrong or missing API key; the key itself is never printed).
        TargetUnavailable: nothing answers at ``url``.
    """
    return [m["id"] for m in models_served(url, api_key, timeout_s)]


# what each engine writes into its /v1/models entries' `owned_by` (vllm/entrypoints/openai protocol.py
# `owned_by: str = "vllm"`; sglang/srt/entrypoints/openai/protocol.py `owned_by: str = "sglang"`): the one field that
# tells the two apart, both answering the same OpenAI chat API on the same default port
ENGINES_BY_OWNER = {"vllm": "vllm", "sglang": "sglang"}


def served_engine(url: str, model: str, api_key: str | None = None, timeout_s: float = 5.0) -> str | None:
    """The engine serving ``model`` at ``url`` (``"vllm"`` or ``"sglang"``), as its ``GET /v1/models`` entry says
    (``owned_by``, :data:`ENGINES_BY_OWNER`); None for another server, or one that does not say.

    Raises:
        TargetAuthError / TargetUnavailable: as :func:`models_served`.
    """
    for m in models_served(url, api_key, timeout_s):
        if m.get("id") == model:
            return ENGINES_BY_OWNER.get(str(m.get("owned_by", "")))
    return None


def served_context(url: str, model: str, api_key: str | None = None, timeout_s: float = 5.0) -> int | None:
    """The context length (prompt + answer, in tokens) the server accepts for ``model``: ``max_model_len`` of its
    ``GET /v1/models`` entry (vLLM and SGLang both report it), or None when the server does not say.

    Raises:
        TargetAuthError / TargetUnavailable: as :func:`models_served`.
    """
    for m in models_served(url, api_key, timeout_s):
        if m.get("id") == model and isinstance(m.get("max_model_len"), int):
            return int(m["max_model_len"])
    return None


def resolve_model(url: str, wanted: str | None, api_key: str | None = None) -> str:
    """The served model name to use: ``wanted`` if served, else the only one served.

    Raises:
        TargetUnavailable: the server does not answer.
        ModelNotServed: ``wanted`` is not served (the message lists what is), or several are and none was named.
    """
    names = served_models(url, api_key)
    if wanted:
        if wanted in names:
            return wanted
        raise ModelNotServed(
            f"the server at {url} does not serve model {wanted!r}; it serves: {', '.join(names) or 'nothing'}",
            "pass one of those names as --model (target.model)",
        )
    if len(names) == 1:
        return names[0]
    raise ModelNotServed(
        f"the server at {url} serves {len(names)} models ({', '.join(names)})", "name one with --model"
    )
