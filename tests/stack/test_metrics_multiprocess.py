"""Metrics from forked rq work-horses reach the pool's /metrics (draftsmith.metrics.prepare_multiprocess_dir).

The worker pool imports draftsmith.metrics (and so prometheus_client) before it sets PROMETHEUS_MULTIPROC_DIR;
prometheus_client chooses its value class on import, and counters set in a forked child were lost. Checked in a
fresh interpreter, in the pool's order: import, prepare the folder, fork, count in the child, collect in the parent.
"""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import os, sys
from pathlib import Path
import draftsmith.metrics as M                      # the pool's order: metrics imported first
M.prepare_multiprocess_dir(Path(sys.argv[1]))
pid = os.fork()
if pid == 0:                                        # an rq work-horse
    M.GEN_REQUESTS.labels("r", "ok").inc(3)
    M.GEN_COMPLETION_TOKENS.labels("r").inc(57)
    M.GEN_LATENCY.labels("r").observe(1.5)
    M.EXTRACT_TARGET_LOADS.labels("hf").inc()       # what an extraction worker counts when it loads the target
    os._exit(0)
os.waitpid(pid, 0)
from prometheus_client import CollectorRegistry, generate_latest, multiprocess
reg = CollectorRegistry()
multiprocess.MultiProcessCollector(reg)
sys.stdout.write(generate_latest(reg).decode())
"""


def test_counters_of_forked_children_are_collected(tmp_path):
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "mp")], capture_output=True, text=True,
                         timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert 'draftsmith_generation_requests_total{outcome="ok",run="r"} 3.0' in lines
    assert 'draftsmith_generation_completion_tokens_total{run="r"} 57.0' in lines
    assert 'draftsmith_generation_request_latency_seconds_count{run="r"} 1.0' in lines
    assert 'draftsmith_extract_target_loads_total{backend="hf"} 1.0' in lines


def test_every_metric_has_labels():
    """A label-less metric makes its value when draftsmith.metrics is imported, before the pool sets its
    multiprocess folder: its counts stay in the process that made them (the target-load counter had none, and
    the pool's /metrics never showed a load)."""
    from draftsmith import metrics as M
    from prometheus_client.metrics import MetricWrapperBase

    bare = [n for n, m in vars(M).items() if isinstance(m, MetricWrapperBase) and not m._labelnames]
    assert bare == []
