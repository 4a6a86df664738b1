"""Micro-batches read ahead by DataLoader workers: the same batches, in the same order, as reading in process; a
Ctrl-C that reaches the workers (the whole process group gets it) does not cost the batches the step still needs.
Real worker processes over the reference run's stored features."""

from __future__ import annotations

import os
import signal

import psutil
import torch
from draftsmith.drafter.data import OfflineFeatures, TrainSamples, make_batches
from draftsmith.drafter.loader import read_ahead
from draftsmith.paths import RunPaths


def _inputs(run_factory):
    s = run_factory("ahead")
    paths = RunPaths(s.runs_dir, s.run)
    samples, feats = TrainSamples(paths.data), OfflineFeatures(paths.features)
    lengths = {sid: x.input_ids.numel() for sid, x in samples.samples.items()}
    return samples, feats, make_batches(lengths, 640, 4, seed=0, epoch=0)


def _new_workers(before: set[int]) -> list[psutil.Process]:
    """This process's children not in ``before``, without multiprocessing's resource tracker (a spawned worker's
    queues start one for the whole process, and it stays)."""
    kids = [c for c in psutil.Process().children() if c.pid not in before and c.is_running()]
    return [c for c in kids if not any("resource_tracker" in a for a in c.cmdline())]


def _same(a, b) -> None:
    assert a.ids == b.ids and a.kept == b.kept and a.tokens == b.tokens > 0
    assert a.tensors.keys() == b.tensors.keys()
    for k in a.tensors:
        assert torch.equal(a.tensors[k], b.tensors[k]), k


def test_workers_read_the_same_batches_in_order(run_factory):
    samples, feats, batches = _inputs(run_factory)
    assert len(batches) >= 6
    here = list(read_ahead(samples, feats, batches, workers=0))
    ahead = list(read_ahead(samples, feats, batches, workers=2))
    assert [h.ids for h in here] == batches
    for a, b in zip(here, ahead, strict=True):
        _same(a, b)


def test_a_ctrl_c_reaching_the_workers_loses_no_batch(run_factory):
    samples, feats, batches = _inputs(run_factory)
    # only the loader's own workers: this pytest process may have other children (another test's server)
    before = {c.pid for c in psutil.Process().children()}
    reader = read_ahead(samples, feats, batches, workers=1, prefetch=1)
    first = next(reader)
    workers = _new_workers(before)
    assert len(workers) == 1, f"expected the loader's one worker process, found {workers}"
    for w in workers:
        os.kill(w.pid, signal.SIGINT)
    rest = list(reader)  # torch's worker loop would have exited on the SIGINT, failing this read
    assert [first.ids] + [h.ids for h in rest] == batches
    _, alive = psutil.wait_procs(workers, timeout=15)  # torch joins them as the reader ends; a loaded machine lags
    assert not alive, f"loader workers outlived the reader: {alive}"


def test_a_worker_does_not_hold_a_copy_of_the_trainers_memory(run_factory):
    """A forked worker mapped every page of the trainer (and kept its own copy of each page the trainer rewrote):
    the default demo's trainer (9.2 GB) and its worker (8.3 GB) beside the target server were killed by the OOM
    killer on a 24 GiB host. Here the test process holds 1 GiB, written, when the worker starts."""
    samples, feats, batches = _inputs(run_factory)
    ballast = torch.ones(2**28)  # 1 GiB of float32, every page written
    before = {c.pid for c in psutil.Process().children()}
    reader = read_ahead(samples, feats, batches, workers=1, prefetch=1)
    next(reader)
    workers = _new_workers(before)
    assert len(workers) == 1
    rss = workers[0].memory_info().rss
    reader.close()
    # a forked worker's RSS counts the 1 GiB it maps; a spawned one holds an interpreter, torch and its batches
    assert rss < 0.75 * ballast.numel() * 4, f"loader worker RSS {rss / 2**20:.0f} MiB: it maps the trainer's memory"


def test_workers_only_where_shared_memory_holds_their_batches(tmp_path, caplog):
    import shutil

    from draftsmith.drafter.loader import shared_memory_workers

    free = shutil.disk_usage(tmp_path).free
    assert shared_memory_workers(2, free // 20, shm=str(tmp_path)) == 2  # 5 batches in half the free space
    assert shared_memory_workers(2, free // 4, shm=str(tmp_path)) == 0  # a container's 64 MB /dev/shm, in kind
    assert "READ-AHEAD OFF" in caplog.text and "shm_size" in caplog.text and "ipc: host" in caplog.text
    assert "train.loader_workers: 0" in caplog.text
    assert shared_memory_workers(0, 1, shm=str(tmp_path)) == 0


def test_every_rank_of_the_host_counts_against_its_shared_memory(tmp_path, caplog, monkeypatch):
    """torchrun's ranks on one host share its /dev/shm: what fits one rank does not fit eight, and only the host's
    first rank says so."""
    import shutil

    from draftsmith.drafter.loader import shared_memory_workers

    free = shutil.disk_usage(tmp_path).free
    assert shared_memory_workers(1, free // 20, shm=str(tmp_path), ranks=1) == 1  # 3 batches in half the free
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert shared_memory_workers(1, free // 20, shm=str(tmp_path)) == 0  # 24 batches do not fit
    assert "READ-AHEAD OFF" not in caplog.text  # one line per host, from its first rank
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert shared_memory_workers(1, free // 20, shm=str(tmp_path)) == 0
    assert caplog.text.count("READ-AHEAD OFF: 8 rank(s) x 1 loader worker(s)") == 1


class _FailsOnThirdBatch:
    """A feature source whose third read fails, as a sample missing from the features does."""

    def __init__(self, feats) -> None:
        self.feats, self.reads = feats, 0

    def get(self, ids):
        from draftsmith.errors import DataError

        self.reads += 1
        if self.reads == 3:
            raise DataError("sample s028 has no features", "re-run `draftsmith extract`")
        return self.feats.get(ids)


def test_an_error_in_a_worker_stops_the_workers_with_it(run_factory):
    """The worker's error reaches the trainer, and the workers end with it: before, the error's traceback kept the
    loader alive to the interpreter's exit, whose join of the workers (they ignore SIGTERM) never returned, and
    `draftsmith train` printed its error and hung."""
    import pytest
    from draftsmith.errors import DataError

    samples, feats, batches = _inputs(run_factory)
    before = {c.pid for c in psutil.Process().children()}
    reader = read_ahead(samples, _FailsOnThirdBatch(feats), batches, workers=1, prefetch=1)
    next(reader)
    workers = _new_workers(before)
    assert len(workers) == 1
    with pytest.raises(DataError, match="has no features") as caught:
        list(reader)
    _, alive = psutil.wait_procs(workers, timeout=15)
    assert not alive and caught.value is not None, f"loader workers outlived the error: {alive}"
