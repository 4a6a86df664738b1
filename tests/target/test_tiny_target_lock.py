"""A tiny target is built by one process at a time per cache: a build that finds another one under way waits for it,
writes nothing meanwhile, then finds the checkpoint current; nothing but the checkpoint is left in the cache's models
folder (the lock is on the folder itself).

Real processes (the suite's workers, or a demo beside a test, build the tiny targets into the shared
``~/.cache/draftsmith``); random weights (``steps=0``: a few seconds) so that the test is about the lock. The test
process holds the lock itself, so that the wait is certain rather than a race.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD = """
import sys
from pathlib import Path
from draftsmith.log import setup_logging
from draftsmith.target.tiny_mla import make_tiny_mla
setup_logging()
print(make_tiny_mla(Path(sys.argv[1]), Path(sys.argv[2]), steps=0))
"""


def build(cache: Path, log: Path) -> subprocess.Popen:
    with log.open("w") as err:
        return subprocess.Popen([sys.executable, "-c", BUILD, str(cache), str(REPO / "data" / "prompts")],
                                stdout=subprocess.PIPE, stderr=err, text=True,
                                env={"PYTHONPATH": str(REPO / "shared"), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})


def test_a_build_waits_for_the_one_under_way_then_finds_its_checkpoint(tmp_path):
    from draftsmith.target.tiny_mla import DONE_MARKER, TINY_MLA_NAME, build_lock, tiny_mla_dir

    cache = tmp_path / "cache"
    folder = tiny_mla_dir(cache)
    with build_lock(folder):  # another builder, under way
        waiting = build(cache, tmp_path / "first.log")
        deadline = time.time() + 120
        while "another process is building" not in (tmp_path / "first.log").read_text():
            assert waiting.poll() is None and time.time() < deadline, (tmp_path / "first.log").read_text()[-3000:]
            time.sleep(0.2)
        time.sleep(1)
        assert waiting.poll() is None and not (cache / "models" / f"{TINY_MLA_NAME}.tmp").exists()
    out, _ = waiting.communicate(timeout=300)
    first = (tmp_path / "first.log").read_text()
    assert waiting.returncode == 0 and "tiny MLA target built at" in first, first[-3000:]
    assert Path(out.strip().splitlines()[-1]) == folder
    again = build(cache, tmp_path / "second.log")
    out, _ = again.communicate(timeout=300)
    second = (tmp_path / "second.log").read_text()
    assert again.returncode == 0 and "tiny MLA target already built" in second, second[-3000:]
    assert "another process is building" not in second
    assert json.loads((folder / DONE_MARKER).read_text())["steps"] == 0
    assert sorted(p.name for p in (cache / "models").iterdir()) == [TINY_MLA_NAME]  # no .tmp, no lock file
