"""``draftsmith status``: one line per stage of a run, from the first second of the run.

Generation reads the live Redis hash (or the record shards on disk when Redis lost it); every other stage writes
one snapshot shape to ``runs/<run>/status/<stage>.json`` (owned by :mod:`draftsmith.artifacts.status`: ``stage``,
``phase``, ``line``, ``updated_at`` in epoch seconds, plus the stage's own figures), and ``status`` prints its
``line`` without knowing anything else about the stage.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import typer

from draftsmith.artifacts import checkpoints as ckpt
from draftsmith.artifacts.location import probe
from draftsmith.artifacts.report import report_paths
from draftsmith.artifacts.status import read_snapshots, snapshot_line, snapshot_phase
from draftsmith.config import Settings
from draftsmith.generation.progress import ProgressBoard, snapshot
from draftsmith.paths import RunPaths
from draftsmith.run_health import diagnose, extraction_line, queue_health


@dataclass
class RunStatus:
    """Everything ``status`` shows: one line per stage, generation's done/total, and whether to stop watching."""

    lines: list[str] = field(default_factory=list)
    finished: bool = True
    done: int = 0
    total: int = 0


def generation_line(s: Settings, client, snap, run_root: Path) -> tuple[str, bool]:
    """Generation's status line: the progress line and where the prompts without a record are (queued, running,
    to be retried, failed for good, held by a worker that is gone, in no job: :class:`~draftsmith.run_health.
    QueueHealth`), unless rq's registries, the age of the last result or the free disk say the run failed or
    stalled (then that phase, no ETA, the reason and the fix: :func:`draftsmith.run_health.diagnose`). Returns the
    line and whether nothing will change without the user."""
    import dataclasses

    import redis

    health, progress = None, {}
    if client is not None and snap.phase != "done":
        try:
            health = queue_health(client, s.redis.prefix, run_root)
            progress = ProgressBoard(client, s.redis.prefix, run_root).read()
        except redis.RedisError:
            health, progress = None, {}
    verdict = diagnose(snap, health, progress, run_root, s.run, s.generation.min_free_disk_gb)
    if verdict is not None:
        return f"{dataclasses.replace(snap, phase=verdict.phase, eta_s=None).line()} | {verdict.line()}", \
            verdict.phase == "failed"
    line = snap.line()
    if health is not None and health.missing:
        line += f" | {health.line()}"
        if health.failed_jobs:
            line += f" (last error: {health.reasons.most_common(1)[0][0]})"
        if health.orphaned or health.unassigned:
            line += f" -> `draftsmith enqueue --run {s.run}` requeues what no live job holds"
    return line, False


def collect_status(s: Settings) -> RunStatus:
    """Read the run's status from Redis (generation) and the stage snapshots (every other stage)."""
    import redis

    paths = RunPaths(s.runs_dir, s.run)
    out = RunStatus()
    probe(paths.root)  # a store that is away or refuses: one line, not a traceback from its client (a path: no-op)
    if not paths.root.exists():
        out.lines.append(f"run {s.run}: nothing under {paths.root} yet (phase: not started)")
        return out
    client = None
    try:
        client = redis.Redis.from_url(s.redis.url, socket_connect_timeout=2)
        client.ping()
    except redis.RedisError:
        client = None
    live = client is not None and bool(ProgressBoard(client, s.redis.prefix, paths.root).read())
    if paths.prompts.exists() or live:
        snap = snapshot(client, s.redis.prefix, paths.root)
        src = "" if snap.source == "redis" else " (from disk)"
        line, failed_for_good = generation_line(s, client, snap, paths.root)
        out.lines.append(f"generation{src}: {line}")
        out.finished = snap.phase in ("done", "idle", "empty") or failed_for_good
        out.done, out.total = snap.done, snap.total
    for st in read_snapshots(paths.root):
        age = time.time() - st["updated_at"]
        phase = snapshot_phase(st)
        out.lines.append(f"{st['stage']}: [{phase}] {snapshot_line(st)} (updated {age:.0f} s ago)")
        if phase not in ("done", "failed", "skipped"):
            out.finished = False
    if client is not None:
        try:
            if (line := extraction_line(client, s.redis.prefix, paths.root, s.run)) is not None:
                out.lines.append(line)
        except redis.RedisError as e:  # Redis went away meanwhile: the snapshots above still say what they know
            out.lines.append(f"extraction queue: not read, Redis stopped answering ({e})")
    out.lines.extend(made_by(paths))
    return out


def made_by(paths: RunPaths) -> list[str]:
    """``made by ...`` lines: the ``code_version`` stamped in each artifact of the run that has one
    (:mod:`draftsmith.artifacts.provenance`), one line when they agree, one per artifact when they do not."""
    import json

    files = {"records": paths.records_manifest, "data": paths.data_manifest, "features": paths.features_manifest,
             "eval": report_paths(paths.eval)["json"]}
    try:
        latest = ckpt.read_latest(paths.checkpoints)
    except (ValueError, KeyError):
        latest = None
    if latest:
        files["checkpoint"] = paths.checkpoints / latest / ckpt.STATE_FILE
    found = {}
    for name, f in files.items():
        try:
            v = json.loads(f.read_text()).get("code_version")
        except (OSError, ValueError, AttributeError):
            continue
        if v:
            found[name] = v
    if not found:
        return []
    if len(set(found.values())) == 1:
        return [f"made by {next(iter(found.values()))} ({', '.join(found)})"]
    return [f"made by: {name} {v}" for name, v in found.items()]


def print_status(s: Settings) -> bool:
    """Print the run's status once; returns True when nothing is left to wait for."""
    st = collect_status(s)
    for line in st.lines:
        typer.echo(line)
    return st.finished


def watch_status(s: Settings, interval_s: float) -> None:
    """Refresh the status until the run is finished: a rich progress bar of generation on a terminal, plain
    lines otherwise (logs stay greppable)."""
    import sys

    if not sys.stdout.isatty():
        while not print_status(s):
            time.sleep(interval_s)
        return
    from rich.console import Group
    from rich.live import Live
    from rich.progress_bar import ProgressBar
    from rich.text import Text

    def view() -> tuple[Group, bool]:
        st = collect_status(s)
        parts = []
        if st.total:
            parts.append(Text(f"generation {st.done}/{st.total}"))
            parts.append(ProgressBar(total=st.total, completed=st.done, width=60))
        parts.extend(Text(line) for line in st.lines)
        return Group(*parts), st.finished

    group, finished = view()
    with Live(group, refresh_per_second=4) as live:
        while not finished:
            time.sleep(interval_s)
            group, finished = view()
            live.update(group)
