"""One exception class per failure mode a user can cause or fix.

Every :class:`DraftsmithError` carries the fix in its message. The CLI prints it as one line and exits with
code 2; anything else is a bug and keeps its traceback (torchtitan's rule: ``ValueError``-style errors for users,
``assert`` only for invariants).
"""

from __future__ import annotations


class DraftsmithError(Exception):
    """A user-facing error: ``str(err)`` says what went wrong and how to fix it.

    Args:
        message: what went wrong, in one sentence.
        hint: how to fix it (optional); appended after " -> ".
    """

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(f"{message} -> {hint}" if hint else message)


class ConfigError(DraftsmithError):
    """The configuration (YAML file, environment or flags) is invalid."""


class RunSettingsMismatch(ConfigError):
    """A queued job's run settings disagree with what its run recorded. Running it again cannot help, so the worker
    fails it for good at once (``retryable``), whatever retries it was enqueued with."""

    retryable = False


class SourceError(DraftsmithError):
    """A prompt source cannot be read or holds no usable prompt."""


class TargetUnavailable(DraftsmithError):
    """The target server does not answer at its URL."""


class TargetAuthError(TargetUnavailable):
    """The target server answers but refuses our credentials (HTTP 401/403): the API key is wrong or missing."""


class ModelNotServed(DraftsmithError):
    """The requested model name is not among the models the server serves."""


class DiskSpaceError(DraftsmithError):
    """Free disk space is below what the stage needs."""


class StorageError(DraftsmithError):
    """The object store that holds the run (``runs_dir`` as a URL) cannot be reached, refuses access or lacks the
    bucket."""


class DataError(DraftsmithError):
    """Records, training data or features are missing, malformed or inconsistent."""


class ModelError(DraftsmithError):
    """A model folder, checkpoint or drafter does not fit what it is used with."""


class QueueError(DraftsmithError):
    """Redis cannot be reached or holds inconsistent queue state."""


class EngineError(DraftsmithError):
    """A serving engine failed to start or answered unexpectedly."""


class TrainingError(DraftsmithError):
    """Training cannot go on (a NaN or Inf loss, a bad resume state)."""


class Interrupted(DraftsmithError):
    """A signal (Ctrl-C, SIGTERM from ``timeout``/``docker stop``/a preempting scheduler) stopped a batch command;
    what it finished is kept. ``str(err)`` is the one line the CLI prints:
    ``stopped by SIGTERM; kept: <kept> -> <hint>``. Exit code: the shell's ``128 + signal number`` (130, 143).

    Args:
        kept: what the stop keeps (``"checkpoint step-00000012 in runs/r1/checkpoints"``); None when the command
            declared nothing.
        hint: what to do next (default: run the same command again to resume).
        signum: the signal.
    """

    def __init__(self, kept: str | None, hint: str | None = None, signum: int = 2) -> None:
        import signal

        self.signum = signum
        self.exit_code = 128 + signum
        self.kept = kept
        head = f"stopped by {signal.Signals(signum).name}" + (f"; kept: {kept}" if kept else "")
        super().__init__(head, hint or "run the same command again to resume")


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is a full disk or an exhausted quota: ``OSError`` ENOSPC/EDQUOT, or a library's wrapping of
    it (safetensors' ``SafetensorError: ... IoError(Os { code: 28, kind: StorageFull ... })``)."""
    import errno

    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    return "No space left on device" in text or "StorageFull" in text or "Disk quota exceeded" in text


class TransientFailures(RuntimeError):
    """Some work items of a job failed transiently after every retry of their requests; the job's rq Retry runs it
    again (the worker pool reports it in one line, like a :class:`DraftsmithError`)."""
