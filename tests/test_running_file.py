"""The running-tests file `.ci/run` prints at its end (tests/running_file.py), written by a real pytest run: a test
sees itself listed as running while it runs, and the finished tests are listed with their real durations."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

INNER = '''
import os, time
from pathlib import Path

def test_sleeps():
    time.sleep(0.6)

def test_sees_itself_running():
    text = Path(os.environ["TEST_DRAFTSMITH_RUNNING_FILE"]).read_text()
    assert "1 finished, 1 running" in text, text
    assert "running" in text.splitlines()[1] and text.splitlines()[1].endswith("::test_sees_itself_running"), text
'''


def test_the_file_lists_the_running_test_and_the_finished_ones_with_their_time(tmp_path):
    (tmp_path / "conftest.py").write_text("import running_file\n\n\ndef pytest_configure(config):\n"
                                          "    running_file.register(config)\n")
    (tmp_path / "test_inner.py").write_text(INNER)
    out = tmp_path / "running.txt"
    env = {**os.environ, "TEST_DRAFTSMITH_RUNNING_FILE": str(out), "PYTHONPATH": str(TESTS)}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                        "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:]
    text = out.read_text()
    assert re.match(r"tests after \d+ s: 2 finished, 0 running\n", text), text
    took = dict((n.split("::")[-1], float(s)) for s, n in re.findall(r"^  took +([\d.]+) s  (\S+)$", text, re.M))
    assert set(took) == {"test_sleeps", "test_sees_itself_running"}, text
    assert 0.5 <= took["test_sleeps"] < 30 and list(took)[0] == "test_sleeps"  # slowest first
