"""Micro-batches read ahead of the training step: feature reads, the finiteness check and padding off its path.

A micro-batch is a list of sample ids (:func:`draftsmith.drafter.data.make_batches`). :func:`host_batch` turns one
into padded CPU tensors; :func:`read_ahead` yields them in order through torch's ``DataLoader``, whose worker
processes read the next micro-batches' feature slices while the step runs (``train.loader_workers``; 0 = in this
process, one at a time). On a GPU the tensors are pinned, so their copy to the device does not block the host.

Only stored features are read by workers: streamed features come from a target model this process holds, so they
are read in process whatever the setting.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset

from draftsmith.drafter.data import FeatureSource, TrainSamples, collate
from draftsmith.log import get_logger


@dataclass
class HostBatch:
    """One micro-batch on the host.

    ids: the micro-batch's sample ids. kept: those with finite features (the others are skipped and counted).
    tensors: :func:`~draftsmith.drafter.data.collate` of the kept samples (``input_ids [B, T]``, ``loss_mask
    [B, T]``, ``aux [B, T, 3H]``, ``final [B, T, H]``, ``lengths [B]``), or ``None`` when none was kept.
    tokens: real (unpadded) tokens of the kept samples.
    """

    ids: list[str]
    kept: list[str]
    tensors: dict[str, torch.Tensor] | None
    tokens: int

    @property
    def skipped(self) -> int:
        return len(self.ids) - len(self.kept)

    def pin_memory(self) -> HostBatch:
        """Page-locked copies of the tensors (the ``DataLoader``'s ``pin_memory`` calls this)."""
        if self.tensors is not None:
            self.tensors = {k: v.pin_memory() for k, v in self.tensors.items()}
        return self


def host_batch(samples: TrainSamples, features: FeatureSource, ids: list[str]) -> HostBatch:
    """Read and pad one micro-batch on the host; samples with NaN/Inf features are left out.

    Raises:
        DataError: a sample has no features, or features of another length (from :func:`collate`).
    """
    feats = features.get(ids)
    keep = [j for j, (a, f) in enumerate(feats) if bool(torch.isfinite(a).all() and torch.isfinite(f).all())]
    kept = [ids[j] for j in keep]
    if not keep:
        return HostBatch(list(ids), [], None, 0)
    tensors = collate([samples.samples[ids[j]] for j in keep], [feats[j] for j in keep])
    return HostBatch(list(ids), kept, tensors, int(tensors["lengths"].sum()))


class _MicroBatches(Dataset):
    """Micro-batch ``i`` of a fixed list, read by :func:`host_batch` (in a loader worker or in process)."""

    def __init__(self, samples: TrainSamples, features: FeatureSource, batches: Sequence[list[str]]) -> None:
        self.samples, self.features, self.batches = samples, features, list(batches)

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> HostBatch:
        return host_batch(self.samples, self.features, self.batches[i])


def _one(items: list[HostBatch]) -> HostBatch:
    return items[0]


def _ignore_stop_signals(_worker_id: int) -> None:
    # A Ctrl-C reaches the whole process group: the trainer finishes its step (which may still need read-ahead
    # batches) and then ends the workers itself; torch's worker loop would otherwise exit on the SIGINT.
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)


def shared_memory_workers(workers: int, batch_bytes: int, prefetch: int = 2, shm: str = "/dev/shm",
                          ranks: int | None = None) -> int:
    """How many of ``workers`` loader workers fit: their batches travel through shared memory (``/dev/shm``), and
    a container's is 64 MB unless it is given more (Docker's and podman's default), where a worker would fail
    mid-run with a bus error.

    Args:
        batch_bytes: bytes of one micro-batch on the host.
        ranks: training processes on this host, each with its own workers in the same ``/dev/shm``; default
            torchrun's ``LOCAL_WORLD_SIZE`` (1 without torchrun).

    Returns:
        ``workers`` when ``ranks * (workers * prefetch + 1)`` micro-batches fill at most half of the free shared
        memory, else 0 (read in process); then the host's first rank logs one warning with the sizes and the fix.
    """
    import shutil

    if workers <= 0:
        return 0
    ranks = ranks or int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    try:
        free = shutil.disk_usage(shm).free
    except OSError:
        free = 0
    need = ranks * (workers * prefetch + 1) * batch_bytes
    if need <= free // 2:
        return workers
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        get_logger(__name__).warning(
            "READ-AHEAD OFF: %d rank(s) x %d loader worker(s) need ~%.1f GB of shared memory (twice that free) "
            "and %s has %.1f GB free, so features are read in the training step, not ahead. Fix: the host's "
            "/dev/shm (compose.yaml's trainer has ipc: host; docker run --ipc=host) or a larger one "
            "(compose: shm_size, docker run --shm-size=%dg); or set train.loader_workers: 0 to read in the step "
            "without this warning", ranks, workers, need / 1e9, shm, free / 1e9, -(-2 * need // 10**9))
    return 0


def read_ahead(samples: TrainSamples, features: FeatureSource, batches: Sequence[list[str]], workers: int,
               pin: bool = False, prefetch: int = 2) -> Iterator[HostBatch]:
    """Yield :class:`HostBatch` for ``batches`` in order, read ``workers * prefetch`` micro-batches ahead.

    ``workers`` 0 reads each when it is asked for. Workers are spawned (a fresh interpreter each, about 2 s to
    import torch), so ``features`` and ``samples`` must pickle. Stopping early (a signal, the last step, an error in a worker)
    is safe: the loader's workers are stopped when the generator ends or is closed.
    """
    if workers <= 0 or len(batches) <= 1:
        for ids in batches:
            yield host_batch(samples, features, ids)
        return
    # spawned, not forked: a forked worker maps every page the trainer holds at that moment, and each page the
    # trainer then rewrites becomes a second copy kept by the worker, so the pair ends up holding the trainer's
    # memory twice (the default demo's trainer at 9.2 GB and its worker at 8.3 GB were killed by the OOM killer
    # on a 24 GiB host). A spawned worker holds only what it reads: an interpreter, torch and its batches.
    loader = DataLoader(_MicroBatches(samples, features, batches), batch_size=1, shuffle=False,
                        num_workers=min(workers, len(batches)), collate_fn=_one, pin_memory=pin,
                        prefetch_factor=prefetch, persistent_workers=False,
                        worker_init_fn=_ignore_stop_signals, multiprocessing_context="spawn")
    it = iter(loader)
    try:
        yield from it
    finally:
        # now, not when the iterator is collected: after an error the traceback keeps it alive to the interpreter's
        # exit, where multiprocessing joins the workers, which ignore the SIGTERM it sends first (a hang)
        it._shutdown_workers()
