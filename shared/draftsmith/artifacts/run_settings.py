"""``runs/<run>/run-settings.json``: the run's part of the settings (the ``run`` keys of the config schema,
:mod:`draftsmith.config_sections`) as the run recorded them, section by section, with their provenance.

A queued stage records the sections its jobs use when it enqueues them (generation: ``target`` and ``generation``;
extraction: ``extract``), and each worker compares the run settings its job carries with the record before it does
any work (:func:`check_job`): a job left from an enqueue with other settings, or enqueued against this run from a
checkout configured for another, fails with both values and the fix, and nothing the run finished is touched.
The one-off stages (``build-data``, ``train``, ``export``, ``eval``) check and record their sections too
(:mod:`draftsmith.cli.run_record`). The host's part (backend, device, GPUs, URLs, paths) is never recorded here: it
belongs to whichever service runs the job.

Layout::

    {"schema": "draftsmith.run-settings/1",
     "sections": {"extract": {"layers": [1, 14, 26], "dtype": "bfloat16"}, ...},
     "recorded": {"extract": {"code_version": "draftsmith 0.1.0 (git ...)", "config_sha256": "...", "at": 1.7e9}}}
"""

from __future__ import annotations

import json
import time
from typing import Any

from draftsmith.artifacts.location import Location, read_bytes, run_location
from draftsmith.artifacts.provenance import code_version, config_sha256
from draftsmith.artifacts.storage import atomic_write_text
from draftsmith.errors import ConfigError, RunSettingsMismatch

RUN_SETTINGS_FILE = "run-settings.json"
RUN_SETTINGS_SCHEMA = "draftsmith.run-settings/1"


def record_path(run_root: Location | str) -> Location:
    """``runs/<run>/run-settings.json`` (a local path, or an object of a run on a store); ``run_root`` as a string
    is the run's path or URL as a queued job carries it."""
    return run_location(run_root) / RUN_SETTINGS_FILE


def read_record(run_root: Location | str) -> dict[str, Any] | None:
    """The run's record, or None when no stage has recorded one yet.

    Raises:
        ConfigError: the file exists but is not a record of this schema (the message names the file).
        StorageError: the object store of a remote run failed.
    """
    path = record_path(run_root)
    try:
        doc = json.loads(read_bytes(path))
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise ConfigError(f"{path} is not valid JSON ({e})", "delete it; the next enqueue records it again") from e
    if not isinstance(doc, dict) or doc.get("schema") != RUN_SETTINGS_SCHEMA:
        raise ConfigError(f"{path} is not a {RUN_SETTINGS_SCHEMA} record",
                          "delete it; the next enqueue records it again")
    return doc


def record(run_root: Location | str, run_part: dict[str, Any], sections: tuple[str, ...]) -> list[str]:
    """Record ``sections`` of ``run_part`` (:func:`draftsmith.config.run_settings`) as the run's, replacing what
    those sections held and keeping the others.

    Returns:
        ``["section.key: old -> new", ...]`` for every recorded value this changed, for the enqueuer's log: jobs
        still queued with the old values are refused by the workers from now on.
    """
    doc = read_record(run_root) or {"schema": RUN_SETTINGS_SCHEMA, "sections": {}, "recorded": {}}
    changed = []
    for name in sections:
        new = run_part.get(name, {})
        old = doc["sections"].get(name)
        if old is not None:
            changed += [f"{name}.{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new))
                        if old.get(k) != new.get(k)]
        doc["sections"][name] = new
        doc["recorded"][name] = {"code_version": code_version(), "config_sha256": config_sha256(new),
                                 "at": time.time()}
    atomic_write_text(record_path(run_root), json.dumps(doc, indent=1, sort_keys=True))
    return changed


def disagreements(recorded: dict[str, Any], run_part: dict[str, Any],
                  sections: tuple[str, ...]) -> list[tuple[str, Any, Any]]:
    """``[(section.key, job's value, recorded value)]`` for every key of ``sections`` that the record holds and
    ``run_part`` gives otherwise (a section the record lacks is not compared)."""
    out = []
    for name in sections:
        rec = recorded.get("sections", {}).get(name)
        if rec is None:
            continue
        job = run_part.get(name, {})
        out += [(f"{name}.{k}", job.get(k), rec.get(k)) for k in sorted(set(rec) | set(job))
                if job.get(k) != rec.get(k)]
    return out


def check_job(run_root: Location | str, run_part: dict[str, Any], sections: tuple[str, ...], what: str, requeue: str) -> None:
    """Refuse a job whose run settings disagree with the run's record (no record yet: nothing to compare).

    Args:
        run_root: the run folder (or its URL on an object store).
        run_part: the run settings the job carries (:func:`draftsmith.config.run_settings`).
        sections: the sections the job's stage uses.
        what: the job, for the message (``extraction job extract-t-00003``).
        requeue: the command that enqueues the job again with the run's settings.

    Raises:
        RunSettingsMismatch: naming every disagreeing key with the job's value and the recorded one, and the fix.
    """
    doc = read_record(run_root)
    diff = disagreements(doc, run_part, sections) if doc else []
    if not diff:
        return
    keys = "; ".join(f"{k}: job {mine!r}, run {theirs!r}" for k, mine, theirs in diff)
    raise RunSettingsMismatch(
        f"{what} carries run settings that disagree with what the run recorded in {record_path(run_root)} ({keys})",
        f"the job was enqueued with other settings than the run's latest enqueue (an older enqueue, or another "
        f"checkout's config); run `{requeue}` again with the settings the run should have in its .env / config: "
        f"it records them and enqueues this job again. Nothing the run finished was touched")

