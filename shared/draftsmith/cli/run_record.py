"""The run's record (``runs/<run>/run-settings.json``) checked by the one-off stages: ``build-data``, ``train``,
``export`` and ``eval`` (``make data`` / ``train`` / ``export`` / ``eval``), which are not queued and read their
whole settings from their own container and command line.

Each stage owns sections of the record and reads sections that earlier stages recorded (:data:`STAGES`). Before it
does anything, :func:`check_stage`:

- takes every recorded key of those sections that its settings leave unset (no flag, variable or file sets it), as
  an enqueue run again does: the trainer container needs no copy of the generator's ``.env`` lines;
- refuses a key set to another value than the run recorded, naming both values and the fix, when the key belongs
  to an earlier stage's section (the data was built, the features extracted with the recorded value), or to the
  stage's own section while the stage would continue output made with the recorded value (``train`` resuming from
  a checkpoint: one drafter trained with two recipes; only its length, ``train.max_steps`` and ``train.epochs``,
  may change on a resume);
- lets a stage that starts its output over (``build-data`` rebuilds the data, ``export`` rewrites the export,
  ``eval`` measures again, ``train`` with ``train.resume=false`` or no checkpoint yet) give its own section new
  values; :func:`record_stage` then records them and says what changed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from draftsmith.artifacts.checkpoints import FOLDER_GLOB, LATEST_FILE, STATE_FILE
from draftsmith.artifacts.location import Location, run_location
from draftsmith.artifacts.run_settings import RUN_SETTINGS_FILE, read_record, record, record_path
from draftsmith.config import Settings, run_settings, with_run_settings
from draftsmith.config_kinds import key_kind
from draftsmith.errors import RunSettingsMismatch


@dataclass(frozen=True)
class StageKeys:
    """The record's sections a one-off stage reads (``reads``: recorded by earlier stages, never changed by this
    one) and those it records (``owns``)."""

    reads: tuple[str, ...]
    owns: tuple[str, ...]
    make: str  # the make target that runs the stage, for messages


STAGES: dict[str, StageKeys] = {
    "build-data": StageKeys(reads=("target",), owns=("data",), make="make data"),
    "train": StageKeys(reads=("target", "data"), owns=("train",), make="make train"),
    "export": StageKeys(reads=("target",), owns=("export",), make="make export"),
    "eval": StageKeys(reads=("target",), owns=("eval",), make="make eval"),
    # a refresh continues the serving drafter: the run's data, extraction and training recipe, from wherever it runs
    # captured answers are kept as the target's own only at the temperature the run generated with
    "gateway": StageKeys(reads=("generation",), owns=(), make="draftsmith gateway"),
    "refresh": StageKeys(reads=("target", "generation", "data", "extract", "train"), owns=(),
                         make="draftsmith refresh"),
}


# how long to train, not how: raised on a resume, the training goes on (its schedule stretched to the new length)
LENGTH_KEYS = frozenset({"train.max_steps", "train.epochs"})


# keys whose None means "whatever the server has" (target.model: the only model it serves): recorded so, they pin
# nothing, and a later stage may name the model
ANY_WHEN_NONE = frozenset({"target.model"})


def run_root(s: Settings) -> Location:
    """``<runs_dir>/<run>``: a local path or the run's object on a store."""
    return run_location(s.runs_dir) / s.run


def _train_continues(s: Settings) -> str | None:
    """Why ``train`` would continue earlier output (the checkpoint it resumes from), None when it starts over."""
    if not s.train.resume:
        return None
    folder = run_root(s) / "checkpoints"
    name = (
        json.loads((folder / LATEST_FILE).read_text())["checkpoint"]
        if (folder / LATEST_FILE).exists()
        else None
    )
    if name is None and not hasattr(folder, "fs") and folder.is_dir():  # a local run without the pointer
        name = next((p.name for p in sorted(folder.glob(FOLDER_GLOB)) if (p / STATE_FILE).is_file()), None)
    return (
        None
        if name is None
        else f"training would resume from checkpoint {name}, trained with the recorded values"
    )


def check_stage(s: Settings, stage: str) -> tuple[Settings, list[str]]:
    """``s`` checked against the run's record for ``stage`` (a key of :data:`STAGES`), before the stage does
    anything; reads the record only, writes nothing.

    Returns:
        The settings with every recorded key of the stage's sections that ``s`` leaves unset taken from the record
        (it then counts as set: no default of the target's profile replaces it), and one line per taken key whose
        value differs from ``s``'s (``"train.lr=0.0003"``), for the command to print.

    Raises:
        RunSettingsMismatch: a key of the stage's sections is set to another value than the run recorded, and the
            stage may not change it (see the module doc); every such key is named with both values, with the fix.
        ConfigError: the record is unreadable.
    """
    keys = STAGES[stage]
    doc = read_record(run_root(s))
    if not doc:
        return s, []
    mine = run_settings(s)
    taken: dict[str, dict[str, Any]] = {}
    differ: list[tuple[str, str, Any, Any]] = []  # (section, key, this command's value, recorded value)
    for name in keys.reads + keys.owns:
        section = getattr(s, name)
        for key, value in (doc["sections"].get(name) or {}).items():
            model = type(section)
            if (
                key not in model.model_fields
                or key_kind(model, key) != "run"
                or (value is None and f"{name}.{key}" in ANY_WHEN_NONE)
            ):
                continue  # a key this draftsmith no longer has, or not as a run key; a recorded "any"
            if key not in section.model_fields_set:
                taken.setdefault(name, {})[key] = value
            elif mine.get(name, {}).get(key) != value:
                differ.append((name, key, mine[name].get(key), value))
    continues = _train_continues(s) if stage == "train" else None
    refused = [d for d in differ if d[0] in keys.reads or (continues and f"{d[0]}.{d[1]}" not in LENGTH_KEYS)]
    if refused:
        raise _mismatch(s, stage, refused, continues)
    if taken:
        s, _ = with_run_settings(s, taken)
    said = [
        f"{name}.{key}={value!r}"
        for name, kv in taken.items()
        for key, value in kv.items()
        if mine.get(name, {}).get(key) != value
    ]
    return s, said


def _mismatch(
    s: Settings, stage: str, refused: list[tuple[str, str, Any, Any]], continues: str | None
) -> RunSettingsMismatch:
    keys = STAGES[stage]
    listed = "; ".join(f"{n}.{k}: this command {mine!r}, run {rec!r}" for n, k, mine, rec in refused)
    upstream = sorted({n for n, *_ in refused if n in keys.reads})
    fixes = [
        f"leave {', '.join(f'{n}.{k}' for n, k, *_ in refused)} unset (the recorded value is taken) or set "
        "as the run recorded it in .env / JOB_ENV / the config"
    ]
    if upstream:
        fixes.append(
            f"the run's {' and '.join(upstream)} settings were fixed by an earlier stage; other values "
            "make another run (RUN=<new name>)"
        )
    if continues:
        fixes.append(
            f"{continues}; to train with the new values start over in this run (`--no-resume`, "
            "DRAFTSMITH_TRAIN__RESUME=false: its checkpoints are replaced) or train into a new run"
        )
    return RunSettingsMismatch(
        f"{keys.make} (draftsmith {stage}) runs with run settings that disagree with what run {s.run} recorded in "
        f"{record_path(run_root(s))} ({listed})",
        "; ".join(fixes) + ". Nothing was written",
    )


def record_stage(s: Settings, stage: str, root: Location | None = None) -> list[str]:
    """Record the sections ``stage`` owns with ``s``'s values (after :func:`check_stage`, once the stage's own
    defaults are applied) in the record of ``root`` (default: ``s``'s run; a staged copy of a remote run passes
    the run's own location); only the main rank of a torchrun job (``RANK`` 0 or unset) writes.

    Returns:
        ``["train.lr: 0.0003 -> 0.001", ...]`` for every recorded value this changed (a stage that starts its
        output over), for the command to print.

    Raises:
        StorageError: the object store of a remote run failed.
    """
    if int(os.environ.get("RANK", "0")) != 0:
        return []
    return record(run_root(s) if root is None else root, run_settings(s), STAGES[stage].owns)


def settle(s: Settings, stage: str, say: Any, write: bool = True) -> Settings:
    """:func:`check_stage`, then :func:`record_stage` (unless ``write`` is False), each line said through ``say``:
    the one call of a stage whose own defaults need nothing loaded first.

    Raises:
        RunSettingsMismatch, ConfigError, StorageError: see :func:`check_stage` and :func:`record_stage`.
    """
    s, taken = check_stage(s, stage)
    if taken:
        say(f"continuing with the run's recorded {', '.join(taken)} (set them to change the run)")
    if write:
        say_changes(record_stage(s, stage), say)
    return s


def say_changes(changed: list[str], say: Any) -> None:
    """One line naming the recorded values a stage that starts over changed (none: nothing said)."""
    if changed:
        say(f"the run's settings change ({'; '.join(changed)}): recorded in {RUN_SETTINGS_FILE}")
