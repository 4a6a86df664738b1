"""``draftsmith status``: one line per stage of a run, from the first second of the run.

Generation reads the live Redis hash (or the record shards on disk when Redis lost it); the other stages write a
JSON snapshot to ``runs/<run>/status/<stage>.json`` (``phase``, ``line``, ``updated_at``) which is shown as is.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import typer

from draftsmith.config import Settings
from draftsmith.paths import RunPaths, atomic_write_text


def write_snapshot(run_root: Path, stage: str, phase: str, line: str, **numbers: object) -> None:
    """Write a stage's status snapshot (atomic); ``numbers`` are kept for tools and tests."""
    snap = {"stage": stage, "phase": phase, "line": line, "updated_at": time.time(), **numbers}
    atomic_write_text(Path(run_root) / "status" / f"{stage}.json", json.dumps(snap, default=str))


def _ts(v: object) -> float:
    """A snapshot's ``updated_at`` as epoch seconds (stages write floats or ISO-8601 UTC strings)."""
    if isinstance(v, (int, float)):
        return float(v)
    try:
        import calendar

        return float(calendar.timegm(time.strptime(str(v), "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return 0.0


def read_snapshots(run_root: Path) -> list[dict]:
    """Every stage snapshot of a run, least recently updated first."""
    out = []
    for p in sorted((Path(run_root) / "status").glob("*.json")):
        try:
            snap = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        snap.setdefault("stage", p.stem)
        snap["updated_at"] = _ts(snap.get("updated_at", 0))
        out.append(snap)
    return sorted(out, key=lambda d: d["updated_at"])


def snapshot_phase(snap: dict) -> str:
    """``done``/``running``/... of a snapshot (from ``phase``, or from its counters)."""
    if snap.get("phase"):
        return str(snap["phase"])
    for done, total in (("shards_done", "shards_total"), ("step", "total_steps")):
        if total in snap and snap.get(total):
            return "done" if snap.get(done, 0) >= snap[total] else "running"
    return "running"


def snapshot_line(snap: dict) -> str:
    """One progress line of a stage snapshot (its own ``line``, or one built from the known counters)."""
    if snap.get("line"):
        return str(snap["line"])
    if snap.get("stage") == "extract" or "shards_total" in snap:
        return (f"shards {snap.get('shards_done', 0)}/{snap.get('shards_total', '?')}, samples "
                f"{snap.get('samples_done', 0)}/{snap.get('samples_total', '?')}, tokens {snap.get('tokens_done', 0)}"
                f"/{snap.get('tokens_total', '?')}, {snap.get('tokens_per_s', 0):.0f} tok/s, "
                f"{snap.get('bytes_written', 0) / 1e6:.1f} MB written, {snap.get('free_disk_bytes', 0) / 1e9:.1f} GB "
                f"free, skipped {snap.get('skipped_samples', 0)}")
    if snap.get("stage") == "train" or "total_steps" in snap:
        tr = snap.get("train") or {}
        acc = "/".join(f"{a:.2f}" for a in tr.get("acc", []))
        return (f"step {snap.get('step', 0)}/{snap.get('total_steps', '?')} epoch {snap.get('epoch', 0)} loss "
                f"{(tr.get('loss') or [float('nan')])[0]:.3f} acc {acc or '-'} accept_len "
                f"{tr.get('accept_len', float('nan')):.2f} lr {snap.get('lr', 0):.2e} "
                f"{snap.get('tokens_per_s', 0):.0f} tok/s")
    keys = [k for k in snap if k not in ("stage", "updated_at")][:8]
    return ", ".join(f"{k} {snap[k]}" for k in keys)


@dataclass
class RunStatus:
    """Everything ``status`` shows: one line per stage, generation's done/total, and whether to stop watching."""

    lines: list[str] = field(default_factory=list)
    finished: bool = True
    done: int = 0
    total: int = 0


def generation_line(s: Settings, client, snap, run_root: Path) -> tuple[str, bool]:
    """Generation's status line: the progress line, unless rq's registries, the age of the last result or the free
    disk say the run failed or stalled (then that phase, no ETA, the reason and the fix:
    :func:`draftsmith.run_health.diagnose`). Returns the line and whether nothing will change without the user."""
    import dataclasses

    import redis

    from draftsmith.generation.progress import ProgressBoard
    from draftsmith.run_health import diagnose, queue_health

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
    if health is not None and health.failed_jobs:
        reason, _ = health.reasons.most_common(1)[0]
        line += f" | {health.failed_prompts} prompts failed for good so far ({reason})"
    return line, False


def collect_status(s: Settings) -> RunStatus:
    """Read the run's status from Redis (generation) and the stage snapshots (every other stage)."""
    import redis

    from draftsmith.generation.inflight import InflightCap
    from draftsmith.generation.progress import ProgressBoard, snapshot

    paths = RunPaths(s.runs_dir, s.run)
    out = RunStatus()
    if not paths.root.exists():
        out.lines.append(f"run {s.run}: nothing under {paths.root} yet (phase: not started)")
        return out
    client, in_flight = None, 0
    try:
        client = redis.Redis.from_url(s.redis.url, socket_connect_timeout=2)
        client.ping()
        in_flight = InflightCap(client, s.redis.prefix, 1, 0).in_flight()
    except redis.RedisError:
        client = None
    live = client is not None and bool(ProgressBoard(client, s.redis.prefix, paths.root).read())
    if paths.prompts.exists() or live:
        snap = snapshot(client, s.redis.prefix, paths.root, in_flight)
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
    return out


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
