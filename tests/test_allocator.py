"""draftsmith.allocator: glibc keeps freed large blocks, so a training step stops mapping and unmapping them; the
trainer asks for it only for micro-batches of at most KEEP_FREED_MAX_TOKENS tokens (its peak grows at long ones)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
from draftsmith.allocator import keep_freed_memory, keep_freed_memory_for
mode = sys.argv[1]
applied = keep_freed_memory() if mode == "keep" else keep_freed_memory_for(int(mode)) if mode.isdigit() else False
def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
import ctypes
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
p = libc.malloc(64 << 20)
ctypes.memset(p, 1, 64 << 20)  # fault the pages in
before = rss_mb()
libc.free(p)
print(applied, round(before - rss_mb()))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux-only")
def test_freed_blocks_stay_in_the_process_only_when_asked():
    def run(mode: str) -> tuple[str, int]:
        out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
        applied, freed_mb = out.stdout.split()
        return applied, int(freed_mb)

    assert run("default") == ("False", 64)  # glibc unmaps a freed 64 MiB block at once: RSS drops by 64 MiB
    applied, freed_mb = run("keep")
    assert applied == "True" and freed_mb == 0  # kept in the heap for the next step


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux-only")
def test_trainer_keeps_freed_memory_only_for_short_micro_batches():
    from draftsmith.allocator import KEEP_FREED_MAX_TOKENS

    def run(tokens: int) -> tuple[str, int]:
        out = subprocess.run([sys.executable, "-c", PROBE, str(tokens)], capture_output=True, text=True, check=True)
        applied, freed_mb = out.stdout.split()
        return applied, int(freed_mb)

    assert run(KEEP_FREED_MAX_TOKENS) == ("True", 0)
    assert run(KEEP_FREED_MAX_TOKENS + 1) == ("False", 64)
