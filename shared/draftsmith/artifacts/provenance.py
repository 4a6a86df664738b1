"""What made an artifact: the code version and the hash of the settings, stamped into every manifest, checkpoint
and report, so that a user can tell which build (and which settings) produced a drafter or a data set.

``code_version`` is ``draftsmith <package version>``, plus ``git describe --always --dirty`` of the checkout the
package runs from when it runs from one (an installed wheel has no git; a clone does); ``config_sha256`` is the
SHA-256 of the resolved config block that the artifact already carries (``config``), keys sorted.
"""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any


@functools.cache
def code_version() -> str:
    """``draftsmith 0.1.0`` or ``draftsmith 0.1.0 (git 5e5a26d-dirty)``; never raises (git missing or slow: the
    package version alone)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        out = f"draftsmith {version('draftsmith')}"
    except PackageNotFoundError:
        out = "draftsmith (not installed)"
    try:  # git finds the work tree from the package's own folder; outside one (a wheel) it fails, and that is fine
        p = subprocess.run(["git", "-C", str(Path(__file__).parent), "describe", "--always", "--dirty", "--tags"],
                           capture_output=True, text=True, timeout=5)
        if p.returncode == 0 and p.stdout.strip():
            out += f" (git {p.stdout.strip()})"
    except (OSError, subprocess.TimeoutExpired):
        pass
    return out


def config_sha256(config: dict[str, Any]) -> str:
    """SHA-256 of ``config`` as JSON with sorted keys (values that JSON cannot hold are written with ``str``)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def stamp(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with ``code_version`` and, when it carries its resolved ``config``, ``config_sha256`` (a new dict;
    ``doc`` is not changed)."""
    out = {**doc, "code_version": code_version()}
    if isinstance(doc.get("config"), dict):
        out["config_sha256"] = config_sha256(doc["config"])
    return out
