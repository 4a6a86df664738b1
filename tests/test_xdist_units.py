"""`make test`'s two workers keep each work unit whole: a file's tests (and every user of a shared resource) run on
one worker, so module fixtures and the shared vLLM server and demo are built once (tests/conftest.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_each_file_runs_whole_on_one_worker():
    files = ["tests/test_makefile.py", "tests/test_metrics_listen.py", "tests/test_secrets.py"]
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-n", "2", "--dist",
                        "loadgroup", "--no-loadscope-reorder", *files], cwd=REPO, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:]
    ran = re.findall(r"^\[(gw\d)\] \[ *\d+%\] PASSED (tests/[\w/]+\.py)::", r.stdout, re.M)
    workers: dict[str, set[str]] = {}
    for worker, file in ran:
        workers.setdefault(file, set()).add(worker)
    assert set(workers) == set(files), r.stdout[-3000:]
    assert all(len(w) == 1 for w in workers.values()), workers
    assert len({w for ws in workers.values() for w in ws}) == 2  # and both workers had work
