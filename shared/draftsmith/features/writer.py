"""A feature shard written as its samples' features are made, in bounded memory (docs/extraction.md, "Memory").

The file is the one :func:`safetensors.torch.save_file` would give readers (formats.md §4: ``aux_hidden
[T_total, 3*H]``, ``final_hidden [T_total, H]``, ``offsets [S+1]`` int64, the same metadata); only the header's
padding and the tensors' order in the file differ, which no reader sees (they read by name). Safetensors has no
append, but every sample's place is known before the first forward pass (the data manifest gives the lengths), so
the writer preallocates the file for the whole shard and writes each sample at its rows with ``pwrite``, in
whatever order the backend finishes them. Samples left out (NaN/Inf) are compacted away at the end by moving the
rows after them down, in chunks; the header is written last, sized for the whole shard and padded with spaces.

Memory held by the writer: none beyond the sample being written (and one ``chunk`` while compacting).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Sequence
from pathlib import Path

import torch

_ST_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.int64: "I64"}


def _pwrite_all(fd: int, data, offset: int) -> None:
    """``os.pwrite`` until every byte is written (Linux writes at most ~2 GiB per call)."""
    view = memoryview(data).cast("B")
    while view.nbytes:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _raw(t: torch.Tensor):
    """The bytes of ``t`` without a copy (a contiguous CPU tensor viewed as uint8)."""
    t = t.detach().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""


class ShardWriter:
    """Writes one feature shard file sample by sample.

    Args:
        path: the file to write (a temporary name; the caller renames it once :meth:`finish` returned).
        lengths: tokens of every sample of the shard, in shard order.
        hidden_size: H of the target.
        dtype: stored dtype (bfloat16, float16 or float32).
        metadata: safetensors ``__metadata__`` (str -> str).
        aux_layers: aux layers stored per token (``aux_hidden`` is ``[T, aux_layers * H]``).

    Raises:
        OSError: the file cannot be created or preallocated (a full disk: ``ENOSPC``).
    """

    def __init__(self, path: Path, lengths: Sequence[int], hidden_size: int, dtype: torch.dtype,
                 metadata: dict[str, str], aux_layers: int = 3) -> None:
        self.path, self.lengths, self.h, self.dtype = Path(path), [int(n) for n in lengths], hidden_size, dtype
        self.aux_width, self.meta = aux_layers * hidden_size, dict(metadata)
        self.es = torch.empty((), dtype=dtype).element_size()
        self.starts = [0]
        for n in self.lengths:
            self.starts.append(self.starts[-1] + n)
        self.total = self.starts[-1]
        self.state: list[str | None] = [None] * len(self.lengths)  # "kept" | "skipped" per sample
        # every number in the header only shrinks when samples are left out: the whole shard's header is the longest
        self.header_len = -(-len(self._header(self.total, len(self.lengths))) // 8) * 8
        self.aux0 = 8 + self.header_len
        self.final0 = self.aux0 + self.total * self.aux_width * self.es
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
        os.ftruncate(self.fd, self.final0 + self.total * self.h * self.es + (len(self.lengths) + 1) * 8)

    def _header(self, tokens: int, samples: int) -> bytes:
        """The safetensors header of a shard of ``tokens`` rows and ``samples`` samples (offsets from the data start)."""
        a = tokens * self.aux_width * self.es
        f = tokens * self.h * self.es
        st = _ST_DTYPES[self.dtype]
        head = {"__metadata__": self.meta,
                "aux_hidden": {"dtype": st, "shape": [tokens, self.aux_width], "data_offsets": [0, a]},
                "final_hidden": {"dtype": st, "shape": [tokens, self.h], "data_offsets": [a, a + f]},
                "offsets": {"dtype": "I64", "shape": [samples + 1], "data_offsets": [a + f, a + f + 8 * (samples + 1)]}}
        return json.dumps(head, separators=(",", ":")).encode()

    def put(self, i: int, aux: torch.Tensor, final: torch.Tensor) -> None:
        """Write sample ``i``'s features: ``aux`` ``[T_i, 3*H]`` and ``final`` ``[T_i, H]`` in the stored dtype, on CPU.

        Raises:
            ValueError: a shape or dtype disagrees with the shard, or the sample was already given.
        """
        n = self.lengths[i]
        if aux.shape != (n, self.aux_width) or final.shape != (n, self.h) or {aux.dtype, final.dtype} != {self.dtype}:
            raise ValueError(f"sample {i}: features {tuple(aux.shape)} {aux.dtype} / {tuple(final.shape)} "
                             f"{final.dtype}, the shard expects [{n}, {self.aux_width}] / [{n}, {self.h}] {self.dtype}")
        self._claim(i, "kept")
        _pwrite_all(self.fd, _raw(aux), self.aux0 + self.starts[i] * self.aux_width * self.es)
        _pwrite_all(self.fd, _raw(final), self.final0 + self.starts[i] * self.h * self.es)

    def skip(self, i: int) -> None:
        """Leave sample ``i`` out of the shard (its rows are compacted away by :meth:`finish`)."""
        self._claim(i, "skipped")

    def _claim(self, i: int, state: str) -> None:
        if self.state[i] is not None:
            raise ValueError(f"sample {i} of the shard was given twice")
        self.state[i] = state

    def _move(self, src: int, dst: int, nbytes: int, chunk: int) -> None:
        """Copy ``nbytes`` from ``src`` to ``dst <= src`` in the file, front to back (safe when they overlap)."""
        for k in range(0, nbytes, chunk):
            n = min(chunk, nbytes - k)
            _pwrite_all(self.fd, os.pread(self.fd, n, src + k), dst + k)

    def finish(self, chunk: int = 64 << 20) -> list[int]:
        """Compact away left-out samples, write the offsets and the header, fsync and close.

        Returns:
            The kept samples' indices, in shard order.

        Raises:
            ValueError: a sample was neither written nor skipped.
        """
        if None in self.state:
            raise ValueError(f"shard incomplete: samples {[i for i, s in enumerate(self.state) if s is None][:10]} "
                             "were never written")
        kept = [i for i, s in enumerate(self.state) if s == "kept"]
        tokens = sum(self.lengths[i] for i in kept)
        aux_row, h_row = self.aux_width * self.es, self.h * self.es
        final0 = self.aux0 + tokens * aux_row
        if len(kept) < len(self.lengths):  # rows only ever move down: aux first, then final behind the shorter aux
            row = 0
            for i in kept:
                self._move(self.aux0 + self.starts[i] * aux_row, self.aux0 + row * aux_row, self.lengths[i] * aux_row,
                           chunk)
                row += self.lengths[i]
            row = 0
            for i in kept:
                self._move(self.final0 + self.starts[i] * h_row, final0 + row * h_row, self.lengths[i] * h_row, chunk)
                row += self.lengths[i]
        offsets = torch.tensor([0, *[self.lengths[i] for i in kept]], dtype=torch.int64).cumsum(0)  # [S+1]
        end = final0 + tokens * h_row
        _pwrite_all(self.fd, _raw(offsets), end)
        head = self._header(tokens, len(kept)).ljust(self.header_len, b" ")
        _pwrite_all(self.fd, struct.pack("<Q", self.header_len) + head, 0)
        os.ftruncate(self.fd, end + offsets.numel() * 8)
        os.fsync(self.fd)
        self.close()
        return kept

    def close(self) -> None:
        """Close the file (idempotent; the caller removes an unfinished one)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def write_groups(lengths: Sequence[int], batch_tokens: int, write_tokens: int) -> list[list[int]]:
    """Split a shard into groups of samples extracted and written together, each under ``write_tokens`` tokens.

    A group is a run of consecutive batches of :func:`draftsmith.features.hf.plan_batches` (``batch_tokens``),
    given in shard order: the hf backend plans the same forward batches inside a group as over the whole shard, so
    a shard's features do not depend on the budget, bit for bit. A batch over the budget is a group of its own.

    Returns:
        Groups of sample indices, each sorted ascending.
    """
    from draftsmith.features.hf import plan_batches

    groups: list[list[int]] = []
    cur: list[int] = []
    held = 0
    for batch in plan_batches(lengths, batch_tokens):
        n = sum(lengths[i] for i in batch)
        if cur and held + n > write_tokens:
            groups.append(sorted(cur))
            cur, held = [], 0
        cur += batch
        held += n
    if cur:
        groups.append(sorted(cur))
    return groups


# bytes held per token of a group: the backend's float32 aux + final (4 * H * 4), the stored-dtype copies
# (4 * H * 2) and, on the vllm backend, the connector's file read back (4 * H * 4)
BYTES_HELD_PER_TOKEN_PER_H = 40
MEMORY_FRACTION = 0.25


def write_budget(write_tokens: int | None, hidden_size: int, batch_tokens: int, available: int | None = None) -> int:
    """Tokens of features one group may hold: ``write_tokens`` when set, else a quarter of the memory available
    now (``psutil.virtual_memory().available``) over :data:`BYTES_HELD_PER_TOKEN_PER_H` x H bytes per token, and
    never under ``batch_tokens`` (one forward pass's features are held anyway).

    Args:
        available: bytes of free memory (a stand-in in tests; None = measured).
    """
    if write_tokens:
        return write_tokens
    if available is None:
        import psutil

        available = psutil.virtual_memory().available
    return max(batch_tokens, int(available * MEMORY_FRACTION) // (BYTES_HELD_PER_TOKEN_PER_H * hidden_size))
