"""The main job end to end on the embedded default: prompts -> drafter -> acceptance in vLLM, one command
(sizes: :mod:`draftsmith.demo_sizes`).

Stages run in order, each as its own ``draftsmith <stage>`` command (the same ones a user runs by hand), with the
run's config written to ``runs/<run>/demo-config.yaml``. ``runs/<run>/demo.json`` records finished stages and their
durations: running the demo again resumes at the first unfinished stage; ``--fresh`` starts over. A stage that
prints nothing for 10 s gets a heartbeat line with its status snapshot, so nothing is silent.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from draftsmith.artifacts.demo import DEMO_CONFIG_FILE, DEMO_STATE_FILE
from draftsmith.artifacts.export import EAGLE3, SPECULATORS, layout_dir
from draftsmith.artifacts.report import read_report
from draftsmith.artifacts.status import read_snapshots, snapshot_line
from draftsmith.artifacts.storage import atomic_write_text
from draftsmith.config import Settings, load_settings
from draftsmith.demo_sizes import DemoSize
from draftsmith.errors import ConfigError, DraftsmithError
from draftsmith.generation.enqueue import enqueue
from draftsmith.generation.progress import snapshot
from draftsmith.jobqueue.queues import connect
from draftsmith.log import get_logger
from draftsmith.paths import RunPaths
from draftsmith.signals import raise_on_sigterm
from draftsmith.target.embedded import embedded_dir
from draftsmith.target.server import VLLMServer, VLLMServerSpec, free_port
from draftsmith.target.tiny_kimi import tiny_kimi_dir
from draftsmith.target.tiny_mla import tiny_mla_dir

log = get_logger(__name__)


STAGES = ("prepare", "serve", "generate", "build-data", "extract", "train", "export", "eval")


class Demo:
    """Runs the stages of one demo run and keeps its state in ``runs/<run>/demo.json``."""

    def __init__(self, s: Settings, size: DemoSize, say: Callable[[str], None] = print) -> None:
        self.s = s
        self.size = size
        self.say = say
        self.paths = RunPaths(s.runs_dir, s.run)
        self.state_file = self.paths.root / DEMO_STATE_FILE
        self.config_file = self.paths.root / DEMO_CONFIG_FILE
        self.server = None
        self.url: str | None = None
        self._stage_t0 = 0.0

    # ---- state
    def load_state(self) -> dict[str, Any]:
        if self.state_file.exists():
            st = json.loads(self.state_file.read_text())
            if st.get("size") != self.size.name:
                raise DraftsmithError(
                    f"run {self.s.run} was started with DEMO_SIZE={st.get('size')}, not {self.size.name}",
                    "use the same size, or start over with FRESH=1 (make demo FRESH=1)")
            return st
        return {"size": self.size.name, "stages": {}}

    def save_state(self, st: dict[str, Any]) -> None:
        atomic_write_text(self.state_file, json.dumps(st, indent=1))

    def settings(self) -> Settings:
        """The run's settings as every stage sees them (the demo config file)."""
        return load_settings(self.config_file, {"redis": {"url": self.s.redis.url}})

    def write_config(self) -> None:
        # the Redis URL (it may hold a password) reaches the stage commands through their environment, not the file
        cfg = {"runs_dir": str(Path(self.s.runs_dir).resolve()), "run": self.s.run,
               "prompts_dir": str(self.prompts_dir()),
               "redis": {"prefix": self.s.redis.prefix}, **self.size.config}
        cfg["target"] = {"cache_dir": str(self.s.target.cache_dir), **self.size.config.get("target", {})}
        if self.size.target != "embedded":
            cfg["target"]["path"] = str(self.target_dir())
        atomic_write_text(self.config_file, yaml.safe_dump(cfg, sort_keys=False))

    # ---- running commands
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTSMITH_")}
        env["DRAFTSMITH_CONFIG"] = str(self.config_file)
        env["DRAFTSMITH_REDIS__URL"] = self.s.redis.url
        env["PYTHONUNBUFFERED"] = "1"
        if self.url:
            env["DRAFTSMITH_TARGET__URL"] = self.url
        return env

    def run_cmd(self, stage: str, args: list[str]) -> None:
        """Run ``draftsmith <args>``, streaming its output; heartbeat after 10 s of silence.

        Raises:
            DraftsmithError: the command failed (its exit code and the command are named).
        """
        cmd = [sys.executable, "-m", "draftsmith", *args]
        proc = subprocess.Popen(cmd, env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                bufsize=1)
        last = [time.time()]

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                last[0] = time.time()
                self.say(f"  {line.rstrip()}")

        t = threading.Thread(target=pump, daemon=True)
        t.start()
        t0 = time.time()
        try:
            while proc.poll() is None:
                time.sleep(0.5)
                if time.time() - last[0] >= 10:
                    last[0] = time.time()
                    self.say(f"  ... {stage} running for {time.time() - t0:.0f} s{self.snapshot_hint(stage)}")
        except BaseException:  # Ctrl-C / SIGTERM: the stage command stops its own servers on SIGTERM
            stop_child(proc)
            raise
        t.join(timeout=5)
        if proc.returncode != 0:
            raise DraftsmithError(f"stage {stage} failed: `draftsmith {' '.join(args)}` exited with {proc.returncode}",
                                  "fix what its output says, then run `make demo` again: finished stages are kept")

    def snapshot_hint(self, stage: str) -> str:
        if stage == "generate":
            try:
                return " | " + snapshot(connect(self.s.redis.url), self.s.redis.prefix, self.paths.root).line()
            except DraftsmithError:
                return ""
        name = {"build-data": "data"}.get(stage, stage)
        for snap in read_snapshots(self.paths.root):
            if snap["stage"] in (name, stage) and snap["updated_at"] >= self._stage_t0:
                return f" | {snapshot_line(snap)}"
        return ""

    def prompts_dir(self) -> Path:
        """The bundled prompt pools (setting ``prompts_dir``, absolute).

        Raises:
            ConfigError: the folder lacks a pool this size enqueues.
        """
        d = Path(self.s.prompts_dir).resolve()
        missing = [p for p in self.size.pools if not (d / p).is_file()]
        if missing:
            raise ConfigError(f"prompt pools {missing} are not in {d}",
                              "run from the checkout's root (make demo), or set DRAFTSMITH_PROMPTS_DIR to its "
                              "data/prompts")
        return d

    # ---- stages
    def target_dir(self) -> Path:
        """The demo's target checkpoint folder (the embedded SmolLM2, the tiny MLA or the tiny Kimi-K2.5 target)."""
        dirs = {"tiny-mla": tiny_mla_dir, "tiny-kimi": tiny_kimi_dir, "embedded": embedded_dir}
        return dirs[self.size.target](self.s.target.cache_dir)

    def stage_prepare(self) -> None:
        cmd = {"tiny-mla": "make-tiny-mla", "tiny-kimi": "make-tiny-kimi", "embedded": "prepare"}[self.size.target]
        self.run_cmd("prepare", ["target", cmd])

    def start_server(self) -> None:
        t = self.settings().target
        model = self.target_dir()
        spec = VLLMServerSpec(model=model, served_name=model.name, port=free_port(), dtype=t.dtype,
                              max_model_len=t.max_model_len, kv_cache_gib=t.kv_cache_gib,
                              enforce_eager=t.enforce_eager, extra_args=list(t.extra_args),
                              trust_remote_code=t.trust_remote_code)
        self.server = VLLMServer(spec, self.paths.logs / "vllm-target.log")
        self.server.start(timeout_s=t.startup_timeout_s)
        self.url = self.server.url

    def stage_generate(self) -> None:
        s = load_settings(self.config_file, {"target": {"url": self.url}, "redis": {"url": self.s.redis.url}})
        for pool, n in self.size.pools.items():
            # file order: the tiny targets were trained on the first rows of their pools (target/tiny_mla.py)
            enqueue(s, str(self.prompts_dir() / pool), n, s.generation.batch_size,
                    say=lambda m: self.say(f"  {m}"), sample_seed=None)
        procs = ["--processes", str(self.size.workers)] if self.size.workers else []
        self.run_cmd("generate", ["worker", "--burst", *procs, "--metrics-port", "0"])
        snap = snapshot(connect(s.redis.url), s.redis.prefix, self.paths.root)
        self.say(f"  generation: {snap.line()}")
        if snap.done < snap.total:
            raise DraftsmithError(f"generation finished with {snap.total - snap.done} prompts without a record",
                                  "run `make demo` again: it re-enqueues what is missing")

    def stage_build_data(self) -> None:
        self.run_cmd("build-data", ["build-data", "--run", self.s.run])

    def stage_extract(self) -> None:
        self.run_cmd("extract", ["extract", "--run", self.s.run, "--sync"])

    def stage_train(self) -> None:
        self.run_cmd("train", ["train", "--run", self.s.run])

    def stage_export(self) -> None:
        self.run_cmd("export", ["export", "--run", self.s.run, "--format", "both"])

    def stage_eval(self) -> None:
        args = ["eval", "--run", self.s.run, "--engine", "vllm"]
        if self.url:
            args += ["--baseline-url", self.url]
        self.run_cmd("eval", args)

    # ---- the whole job
    def run(self, fresh: bool = False) -> dict[str, Any]:
        """Run every unfinished stage; returns the final state (stage durations) and prints the report.

        SIGTERM/SIGHUP raise like Ctrl-C (:func:`draftsmith.signals.raise_on_sigterm`): the running stage command
        and the target server are stopped, finished stages are kept."""
        raise_on_sigterm()
        if fresh and self.paths.root.exists():
            self.say(f"FRESH: removing {self.paths.root}")
            shutil.rmtree(self.paths.root)
        self.paths.ensure(self.paths.logs)
        st = self.load_state()
        self.write_config()
        todo = [x for x in STAGES if not st["stages"].get(x, {}).get("done")]
        need_server = any(x in todo for x in ("generate", "eval"))
        t_all = time.time()
        try:
            for stage in STAGES:
                if stage == "serve":
                    if need_server:
                        self._timed(st, "serve", self.start_server, record=False)
                    continue
                if stage not in todo:
                    self.say(f"== {stage}: done earlier ({st['stages'][stage]['seconds']:.0f} s), skipped")
                    continue
                self._timed(st, stage, getattr(self, "stage_" + stage.replace("-", "_")))
        finally:
            if self.server:
                self.say("== stopping the target server")
                self.server.stop()
        st["total_seconds"] = time.time() - t_all
        self.save_state(st)
        self.report(st)
        return st

    def _timed(self, st: dict[str, Any], stage: str, fn: Callable[[], None], record: bool = True) -> None:
        self.say(f"== {stage}: start ({time.strftime('%H:%M:%S')})")
        t0 = self._stage_t0 = time.time()
        fn()
        dt = time.time() - t0
        self.say(f"== {stage}: done in {dt:.0f} s")
        if record:
            st["stages"][stage] = {"done": True, "seconds": round(dt, 1), "finished_at": time.time()}
            self.save_state(st)

    def report(self, st: dict[str, Any]) -> None:
        """Print acceptance per set, speedup, artifacts and stage timings."""
        rep = read_report(self.paths.eval)
        self.say("")
        self.say(f"==================== draftsmith demo report (size {self.size.name}) ====================")
        if rep is not None:
            for eng in rep.get("results", []):
                self.say(f"engine {eng.get('engine')}  k={eng.get('k')}  temperature={eng.get('temperature')}")
                self.say(f"  {'set':<12} {'accept len':>10} {'accept rate':>11} {'tok/s':>8} {'base tok/s':>10} {'speedup':>8}")
                sets = dict(eng.get("sets", {}))
                if "overall" in eng:
                    sets["overall"] = eng["overall"]
                for name, m in sets.items():
                    self.say(f"  {name:<12} {_f(m.get('mean_acceptance_length'), '.2f'):>10} "
                             f"{_f(m.get('acceptance_rate'), '.1%'):>11} {_f(m.get('output_tokens_per_s'), '.1f'):>8} "
                             f"{_f(m.get('baseline_output_tokens_per_s'), '.1f'):>10} {_f(m.get('speedup'), '.2f'):>8}")
            self.say("  (acceptance length = 1 + accepted / drafts, bonus token counted; rate = accepted / drafted)")
        else:
            self.say("no eval report yet")
        self.say("artifacts:")
        for label, p in (("records", self.paths.records), ("training data", self.paths.data),
                         ("features", self.paths.features), ("checkpoints", self.paths.checkpoints),
                         ("drafter (EAGLE-3 layout)", layout_dir(self.paths.export, EAGLE3)),
                         ("drafter (speculators layout)", layout_dir(self.paths.export, SPECULATORS)),
                         ("eval report", self.paths.eval), ("logs", self.paths.logs)):
            self.say(f"  {label:<30} {p}{'' if p.exists() else '  (missing)'}")
        self.say("stage timings:")
        for stage in STAGES:
            if stage in st["stages"]:
                self.say(f"  {stage:<12} {st['stages'][stage]['seconds']:>8.0f} s")
        self.say(f"  {'total':<12} {st.get('total_seconds', 0):>8.0f} s (this invocation)")
        family = (self.size.config.get("train") or {}).get("family", "eagle3")
        self.say(f"drafter family: {family} (train.family); which family to pick for your target and engine, "
                 "measured side by side: docs/families.md, \"Which family to pick\"")


def _f(v: Any, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def stop_child(proc: subprocess.Popen, grace_s: float = 60.0) -> None:
    """SIGTERM a stage command and wait up to ``grace_s`` (it stops its own vLLM server in that time), then
    SIGKILL it."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
