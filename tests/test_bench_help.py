"""Every benchmark script answers ``--help`` with its usage and starts nothing.

A benchmark without an argument parser ran its whole measurement (a vLLM server, SeaweedFS, minutes of CPU) when a
user asked it for help; each script is run here as a user runs it, with a real interpreter.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py"))


def test_every_benchmark_is_listed():
    assert "generation.py" in SCRIPTS and len(SCRIPTS) >= 15, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_prints_usage_and_exits(script):
    # 60 s is far above an import of torch here (~3 s); a script that starts its benchmark instead times out
    p = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True, text=True, timeout=60,
                       cwd=BENCH.parent)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.startswith("usage:"), p.stdout[:500]
