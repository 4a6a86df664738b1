"""SIGTERM and SIGINT for draftsmith's commands: one convention, and every process a command starts stops with it.

The convention (docs/signals.md): a service (``worker``, ``queue-exporter``, ``target serve``) stops cleanly and
exits 0; a batch command prints one line ``stopped by SIGTERM; kept: <what> -> run the same command again to
resume`` and exits with the shell's ``128 + signal`` (143, 130; 129 for SIGHUP). :func:`command` applies it to a
command's function; the CLI applies it to every command in one place (:mod:`draftsmith.cli`).

Python turns SIGINT into ``KeyboardInterrupt`` but dies on SIGTERM (``timeout``, ``docker stop``, a batch
scheduler's preemption) without running ``finally`` blocks or ``__exit__``: a vLLM server started in its own process
group is then orphaned. :func:`raise_on_sigterm` makes SIGTERM (and SIGHUP) raise :class:`Terminated`, a
``KeyboardInterrupt``, so the same clean-up paths run for all three. :class:`StopRequest` is the other mode, for a
loop that must finish its current step first (training saves a checkpoint before it exits).
"""

from __future__ import annotations

import functools
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from draftsmith.errors import Interrupted

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


_KEPT: list[str] = []  # what a stop of the running command keeps, as the command declared it (keep())


def keep(what: str) -> None:
    """Declare what a stop of the running command keeps (``"records in runs/r1/records"``); the "stopped by" line
    names it. A later call replaces an earlier one."""
    _KEPT[:] = [what]


def signum_of(exc: BaseException) -> int:
    """The signal behind an interruption: :class:`Terminated`'s own, else SIGINT (a plain ``KeyboardInterrupt``)."""
    return exc.signum if isinstance(exc, Terminated) else int(signal.SIGINT)


def command(fn: Callable[..., Any], name: str, service: bool) -> Callable[..., Any]:
    """Wrap a CLI command's function with draftsmith's signal convention.

    SIGTERM and SIGHUP raise :class:`Terminated` from the start of the command (:func:`raise_on_sigterm`), so
    every ``finally`` and ``with`` block of the command runs (servers, pools and stage commands it started are
    stopped there). When the interruption reaches the command's top:

    - a service prints ``<name> stopped by SIG...`` and returns: exit code 0, a normal stop;
    - a batch command raises :class:`draftsmith.errors.Interrupted`, which the CLI prints as one line
      (``stopped by SIG...; kept: ... -> run the same command again to resume``) and exits ``128 + signal``.

    The interruption must leave the command as an ``Interrupted`` (a ``DraftsmithError``), not a
    ``KeyboardInterrupt``: typer catches ``KeyboardInterrupt`` around the command and exits 130 without a word,
    SIGTERM included (``Terminated`` is a ``KeyboardInterrupt``). An ``Interrupted`` the command
    raised itself (training, which stops at a step boundary) passes through unchanged.

    Raises:
        Interrupted: a batch command was stopped by a signal.
    """
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        _KEPT.clear()
        raise_on_sigterm()
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt as e:
            signum = signum_of(e)
            if service:
                print(f"{name} stopped by {signal.Signals(signum).name}", file=sys.stderr, flush=True)
                return None
            raise Interrupted(_KEPT[0] if _KEPT else None, signum=signum) from None
        except Interrupted as e:  # a batch stage inside a service (the refresh loop's training) stopped by the signal
            if service:
                print(f"{name} stopped by {signal.Signals(e.signum).name}", file=sys.stderr, flush=True)
                return None
            raise

    run.signal_convention = "service" if service else "batch"  # type: ignore[attr-defined]
    return run
