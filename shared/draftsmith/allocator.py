"""glibc's allocator tuned for a long CPU torch loop: freed memory is kept for the next step, not returned.

By default glibc serves every allocation above 128 KiB-32 MiB with its own ``mmap`` and ``munmap``s it on free. A
training step of the drafter allocates and frees the same few hundred tensors of tens of MB (the target's
draft-vocabulary distribution ``[B, T, N]``, its shifted copies, the log-softmax per TTT step), so each step maps,
faults in and unmaps them again: measured on the default demo's data on 2 cores, a fifth of the CPU time was
spent in the kernel. :func:`keep_freed_memory` sets glibc's own knobs (``mallopt``: no ``mmap`` for large blocks,
no trimming of the heap), which is what PyTorch's CPU performance guide reaches by preloading jemalloc or tcmalloc;
training ran 1.23x (steady state) to 1.30x (first epoch) faster and bf16 extraction 1.26x, float32 extraction
unchanged (docs/benchmarks.md, "bf16 where the CPU has AMX"). The price: the
process keeps its peak heap until it exits, which a training or extraction process does anyway, and a higher peak:
freed blocks stay where they are in the heap, and a later, larger one cannot use the hole. Measured on long
sequences (docs/benchmarks.md, "TTT memory"; one float32 step of an 8B-shaped drafter layer, blockwise TTT) the peak
above the model was 23 % higher at 2k tokens (2.58 vs 2.10 GB), about 50 % at 4k (5.0-5.3 vs 3.5 GB) and 8k
(10.0 vs 6.7 GB), for a step about 10 % faster at 4k. So the trainer keeps freed memory only for micro-batches of at
most :data:`KEEP_FREED_MAX_TOKENS` padded tokens (:func:`keep_freed_memory_for`), where the blocks are small and the
time is won; the extractor always does (its batches are bounded by ``extract.batch_tokens``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

from draftsmith.log import get_logger

log = get_logger(__name__)

# mallopt parameter numbers from glibc's <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_MAX = -4

_APPLIED = False

# Largest micro-batch (padded tokens) for which the trainer keeps freed memory (module docstring).
KEEP_FREED_MAX_TOKENS = 2048


def keep_freed_memory() -> bool:
    """Tell glibc to keep freed memory in the heap (``M_MMAP_MAX = 0``, ``M_TRIM_THRESHOLD`` and ``M_TOP_PAD``
    large) for the rest of this process. Idempotent.

    Returns:
        True when applied (Linux with glibc); False elsewhere (nothing is changed, nothing fails).
    """
    global _APPLIED
    if _APPLIED:
        return True
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other libcs without mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = all(mallopt(p, v) == 1 for p, v in ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 2**31 - 1),
                                             (_M_TOP_PAD, 256 << 20)))
    _APPLIED = ok
    if ok:
        log.debug("glibc allocator: large blocks from the heap, freed memory kept (mallopt)")
    return ok


def keep_freed_memory_for(tokens: int) -> bool:
    """:func:`keep_freed_memory` when a micro-batch holds at most :data:`KEEP_FREED_MAX_TOKENS` padded tokens;
    above that glibc's defaults stay (large blocks mapped and unmapped: no heap fragmentation at long sequences).

    Returns:
        True when freed memory is kept (applied now or before in this process).
    """
    if tokens > KEEP_FREED_MAX_TOKENS:
        if not _APPLIED:
            log.debug("glibc allocator left at its defaults: micro-batches of up to %d tokens", tokens)
        return _APPLIED
    return keep_freed_memory()
