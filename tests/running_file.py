"""Where the suite stands, kept in a file that outlives it: the tests running now (for how long) and the slowest
finished ones. `.ci/run` prints it at its end, so a run stopped from outside (CI's time limit) still says what it
was waiting on; pytest's own ``--durations`` table is printed only when the session ends.

Registered by tests/conftest.py in the process that reports (the xdist controller, or the only process) when
``TEST_DRAFTSMITH_RUNNING_FILE`` names the file.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from pathlib import Path

SLOWEST = 15
ENV = "TEST_DRAFTSMITH_RUNNING_FILE"


def register(config) -> None:
    """Register :class:`RunningFile` on ``config`` in the reporting process when ``$TEST_DRAFTSMITH_RUNNING_FILE``
    is set (an xdist worker's reports reach the controller, which writes the file)."""
    if os.environ.get(ENV) and not hasattr(config, "workerinput"):
        config.pluginmanager.register(RunningFile(os.environ[ENV]), "running-file")


class RunningFile:
    """A pytest plugin that rewrites ``path`` (atomically) whenever a test starts or ends."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.t0 = time.time()
        self.running: dict[str, float] = {}  # nodeid -> wall time it started
        self.spent: dict[str, float] = defaultdict(float)  # nodeid -> setup + call + teardown seconds
        self.done = 0

    def pytest_runtest_logstart(self, nodeid, location) -> None:
        self.running[nodeid] = time.time()
        self.write()

    def pytest_runtest_logreport(self, report) -> None:
        self.spent[report.nodeid] += report.duration
        if report.when == "teardown":
            self.running.pop(report.nodeid, None)
            self.done += 1
            self.write()

    def text(self) -> str:
        """The file's content: one line per running test, then the slowest finished tests (wall seconds)."""
        now = time.time()
        lines = [f"tests after {now - self.t0:.0f} s: {self.done} finished, {len(self.running)} running"]
        lines += [f"  running {now - t:7.0f} s  {nodeid}" for nodeid, t in
                  sorted(self.running.items(), key=lambda kv: kv[1])]
        finished = sorted(((s, n) for n, s in self.spent.items() if n not in self.running), reverse=True)
        lines += [f"  took    {s:7.0f} s  {n}" for s, n in finished[:SLOWEST]]
        return "\n".join(lines) + "\n"

    def write(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(self.text())
        tmp.replace(self.path)
