"""What names a generation job in rq: the function a worker runs, the job's deterministic id, its result's lifetime.

Both ``enqueue`` and the tail re-enqueue (:mod:`draftsmith.generation.tail`) submit the same jobs, so these live in
one module that neither of them owns.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from draftsmith.artifacts.location import run_key

JOB_FUNC = "draftsmith.generation.jobs.generate_job"
# the sections of the run's settings a generation job uses: recorded with the run at enqueue, checked by each job
RUN_SECTIONS = ("target", "generation")
RESULT_TTL_S = 3600  # a finished job's result is read by nobody: disk is the truth; keep it an hour for debugging


def job_id_for(run_root: Path, prompt_ids: list[str]) -> str:
    """Deterministic job id of a batch: ``gen-`` + sha1 of the run folder and the batch's ids (20 hex digits), so
    the same batch enqueued twice is one job."""
    h = hashlib.sha1(run_key(run_root).encode())
    for i in prompt_ids:
        h.update(i.encode())
    return "gen-" + h.hexdigest()[:20]
