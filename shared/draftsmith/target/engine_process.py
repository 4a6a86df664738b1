"""What a started engine's processes leave behind and whether they are gone: a TMPDIR of the server's own (vLLM's
ZMQ socket files and its ``vllm_dist_*`` rendezvous file go there, and the folder goes with the stop) and a check
on the whole process group (``/proc``), used by :class:`draftsmith.target.server.VLLMServer`."""

from __future__ import annotations

import getpass
import os
import tempfile
from pathlib import Path


def engine_tmp_env(env: dict[str, str], tmp_dir: Path) -> dict[str, str]:
    """``env`` with ``TMPDIR`` set to ``tmp_dir``, a folder of one server's own: vLLM puts the ZMQ sockets between
    its API server and engine core there (``ipc://<tempdir>/<uuid>``, three per server), and a killed engine leaves
    them behind; the folder is removed once the server is stopped. torch's inductor cache, which would follow
    ``TMPDIR``, stays where it is without one (``<tempdir>/torchinductor_<user>``) so that compiled servers keep it.
    """
    out = {**env, "TMPDIR": str(tmp_dir)}
    if "TORCHINDUCTOR_CACHE_DIR" not in out:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):  # a container's user without a name: torch names the folder by uid too
            user = f"uid_{os.getuid()}"
        user = "".join("_" if c in '\\/:*?"<>|' else c for c in user)
        out["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), "torchinductor_" + user)
    return out


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies, already dead, do not count); read from ``/proc``."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:  # fields after the name: state, ppid, pgrp, ...
            return True
    return False
