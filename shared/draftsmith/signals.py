"""SIGTERM and SIGINT for draftsmith's commands: every process a command starts stops with it.

Python turns SIGINT into ``KeyboardInterrupt`` but dies on SIGTERM (``timeout``, ``docker stop``, a batch
scheduler's preemption) without running ``finally`` blocks or ``__exit__``: a vLLM server started in its own process
group is then orphaned. :func:`raise_on_sigterm` makes SIGTERM (and SIGHUP) raise :class:`Terminated`, a
``KeyboardInterrupt``, so the same clean-up paths run for all three. :class:`StopRequest` is the other mode, for a
loop that must finish its current step first (training saves a checkpoint before it exits).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

TERMINATING = (signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP received; a ``KeyboardInterrupt`` so every ``except KeyboardInterrupt`` and ``finally``
    runs. ``exit_code`` is the shell's ``128 + signal number``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _raise(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signum)


def raise_on_sigterm() -> bool:
    """Make SIGTERM and SIGHUP raise :class:`Terminated` in this process (idempotent).

    Only from the main thread, and only where the signal still has its default action: a handler installed by
    someone else (rq's worker, torchrun's agent) is kept. Returns True when the handlers are in place.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    ok = True
    for sig in TERMINATING:
        current = signal.getsignal(sig)
        if current is _raise:
            continue
        if current in (signal.SIG_DFL, None):
            signal.signal(sig, _raise)
        else:
            ok = False
    return ok


def exit_code_of(exc: BaseException) -> int:
    """Shell exit code of an interruption: 128 + signal (130 for Ctrl-C, 143 for SIGTERM)."""
    return exc.exit_code if isinstance(exc, Terminated) else 128 + signal.SIGINT


class StopRequest:
    """Context manager: SIGINT/SIGTERM/SIGHUP set :attr:`signum` instead of raising, so a loop can stop at a safe
    point (:attr:`requested`); a second signal raises at once (``KeyboardInterrupt`` / :class:`Terminated`).

    Outside the main thread it installs nothing (``requested`` stays False). The previous handlers come back on exit.
    """

    SIGNALS = (signal.SIGINT, *TERMINATING)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:  # the second signal: the user does not want to wait
            raise KeyboardInterrupt if signum == signal.SIGINT else Terminated(signum)
        self.signum = signum

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)  # type: ignore[arg-type]
        self._old.clear()
