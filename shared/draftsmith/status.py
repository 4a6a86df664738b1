"""``draftsmith status``: one line per stage of a run, from the first second of the run.

Generation reads the live Redis hash (or the record shards on disk when Redis lost it); the other stages write a
JSON snapshot to ``runs/<run>/status/<stage>.json`` (``phase``, ``line``, ``updated_at``) which is shown as is.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from draftsmith.config import Settings
from draftsmith.paths import RunPaths, atomic_write_text


def write_snapshot(run_root: Path, stage: str, phase: str, line: str, **numbers: object) -> None:
    """Write a stage's status snapshot (atomic); ``numbers`` are kept for tools and tests."""
    snap = {"stage": stage, "phase": phase, "line": line, "updated_at": time.time(), **numbers}
    atomic_write_text(Path(run_root) / "status" / f"{stage}.json", json.dumps(snap, default=str))


def read_snapshots(run_root: Path) -> list[dict]:
    """Every stage snapshot of a run, oldest stage first."""
    out = []
    for p in sorted((Path(run_root) / "status").glob("*.json")):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(out, key=lambda d: d.get("updated_at", 0))


def print_status(s: Settings) -> bool:
    """Print the run's status; returns True when nothing is left to wait for."""
    import redis

    from draftsmith.generation.inflight import InflightCap
    from draftsmith.generation.progress import snapshot

    paths = RunPaths(s.runs_dir, s.run)
    if not paths.root.exists():
        typer.echo(f"run {s.run}: nothing under {paths.root} yet (phase: not started)")
        return True
    client, in_flight = None, 0
    try:
        client = redis.Redis.from_url(s.redis.url, socket_connect_timeout=2)
        client.ping()
        in_flight = InflightCap(client, s.redis.prefix, 1, 0).in_flight()
    except redis.RedisError:
        client = None
    finished = True
    if paths.prompts.exists():
        snap = snapshot(client, s.redis.prefix, paths.root, in_flight)
        src = "" if snap.source == "redis" else " (from disk)"
        typer.echo(f"generation{src}: {snap.line()}")
        finished = snap.phase in ("done", "idle", "empty")
    for st in read_snapshots(paths.root):
        age = time.time() - float(st.get("updated_at", 0))
        typer.echo(f"{st.get('stage')}: [{st.get('phase')}] {st.get('line', '')} (updated {age:.0f} s ago)")
        if st.get("phase") not in ("done", "failed", "skipped"):
            finished = False
    return finished
