"""What a generation job costs its work-horse beyond its requests: the imports it makes after the fork.

A work-horse is forked per job, so every module a job imports that the pool did not load before forking is
imported again for every job. torch (pulled in through the target server's dtype rule) cost ~1 s of CPU per job,
ten times the job's own work against a fast server (docs/benchmarks.md, generation_scale)."""

from __future__ import annotations

import json
import subprocess
import sys

from pool_helpers import Stub

JOB = r"""
import json, sys, tempfile
from pathlib import Path
import draftsmith.generation.jobs, draftsmith.metrics  # what the pool loads before it forks (run_pool)
from draftsmith.generation.client import warm_http
warm_http()
import os
from draftsmith.config import load_settings, run_settings
from draftsmith.generation.jobs import generate_job
url, redis_url = sys.argv[1], sys.argv[2]
os.environ["DRAFTSMITH_TARGET__URL"] = url  # the worker's own: a job carries the run's settings only
root = Path(tempfile.mkdtemp())
(root / "prompts.jsonl").write_text("".join(
    json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"q{i}"}]}) + "\n" for i in range(4)))
s = load_settings(None, {"redis": {"url": redis_url, "prefix": "dstest"}, "target": {"url": url, "model": "stub"}})
before = set(sys.modules)
out = generate_job(str(root), "j", [f"p{i}" for i in range(4)], "stub", run_settings(s))
print(json.dumps({"written": out["written"], "torch": "torch" in sys.modules,
                  "new": sorted(m for m in set(sys.modules) - before if not m.startswith("encodings"))}))
"""


def test_a_job_imports_no_torch_after_the_fork(redis_url):
    stub = Stub()
    try:
        p = subprocess.run([sys.executable, "-c", JOB, stub.url, redis_url], capture_output=True, text=True,
                           timeout=120)
    finally:
        stub.close()
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["written"] == 4
    assert res["torch"] is False
    assert not [m for m in res["new"] if m.startswith("draftsmith.")], res["new"]
