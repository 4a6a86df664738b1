"""A server process that a test session shares (tests/conftest.py: the vLLM CPU server on the embedded target)."""

from __future__ import annotations


class SharedServer:
    """A server process shared by a test session: started on first use, and started again when a test left it
    dead (killed it, or crashed it), so one test's accident does not fail every later one.

    Args:
        start: starts the server; returns an object with ``url``, ``proc`` (its ``subprocess.Popen``) and ``stop()``
            (:class:`draftsmith.target.server.VLLMServer` is one).
    """

    def __init__(self, start) -> None:
        self._start = start
        self.server = None
        self.starts = 0

    def url(self) -> str:
        """The server's base URL, after starting it if it is not running."""
        if self.server is not None and self.server.proc.poll() is not None:
            self.server.stop()  # reaps what is left of its process group
            self.server = None
        if self.server is None:
            self.server = self._start()
            self.starts += 1
        return self.server.url

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
