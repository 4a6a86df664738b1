"""Per-process caches of a run, so a generation job's fixed cost does not grow with the run.

The caches belong to the run's stores (:mod:`draftsmith.artifacts.record_store`): the prompts' index (offsets of a
local ``prompts.jsonl``, or the object's prompts kept until its ETag changes) and the done index of the records
(the local journal read incrementally, or the store's listing of sidecars). The rq worker refreshes both before it
forks a work-horse (:func:`warm`), so every horse inherits them and reads only what changed since.
"""

from __future__ import annotations

from draftsmith.artifacts.local_records import DoneIndex  # noqa: F401 (re-exported)
from draftsmith.artifacts.location import Location, run_location
from draftsmith.artifacts.record_store import (  # noqa: F401 (re-exported)
    ObjectPromptIndex,
    PromptIndex,
    prompt_index,
    record_store,
)
from draftsmith.artifacts.records import DoneSet


def done_index(records_dir: Location) -> DoneSet:
    """This process's index of the done prompts of ``records_dir``, refreshed."""
    return record_store(records_dir).done_index()


def warm(run_root: Location | str) -> None:
    """Refresh the caches of a run in this process (the rq worker calls it before forking a work-horse)."""
    root = run_location(run_root)
    if root.is_dir():
        prompt_index(root / "prompts.jsonl")
        done_index(root / "records")
