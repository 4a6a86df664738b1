"""A hidden-states KV connector for vLLM that also runs on CPU (loaded via ``kv_connector_module_path``).

vLLM's ``ExampleHiddenStatesConnector`` copies the hidden states out of the cache into pinned host memory on a
CUDA stream; vLLM's CPU build dies on the first request there (``RuntimeError: pin_memory=True requires a CUDA or
other accelerator backend``, ``docs/extraction.md``). This subclass keeps vLLM's scheduler side
(paths, lock files, delayed block freeing) and replaces only the worker-side copy: on CPU a plain synchronous
copy; on CUDA a device-to-host copy into ordinary (pageable) memory, synchronised before the write.

Use with the ``extract_hidden_states`` speculative method::

    kv_transfer_config = {"kv_connector": "DraftsmithHiddenStatesConnector",
                          "kv_connector_module_path": "draftsmith.features.connector",
                          "kv_role": "kv_producer",
                          "kv_connector_extra_config": {"shared_storage_path": DIR}}

Each finished request leaves ``DIR/<request id>.safetensors`` with ``hidden_states`` ``[T, n_layers, H]`` and
``token_ids`` ``[T]``.
"""

from __future__ import annotations

import fcntl
import os
from functools import partial

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class _Done:
    """Stands in for a CUDA event of a copy that already finished (``get_finished`` polls ``query()``)."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class DraftsmithHiddenStatesConnector(ExampleHiddenStatesConnector):
    """``ExampleHiddenStatesConnector`` without pinned memory or CUDA streams (works on CPU and GPU)."""

    def _submit_async_write(self, pending: PendingSave) -> None:
        """Copy the request's hidden states out of the cache synchronously and hand the write to the pool."""
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        slots = (offsets[None, :] + block_ids[:, None] * self._block_size).flatten()  # [n_blocks * block]
        n = pending.token_ids.shape[0]
        hs = extract_from_kv_cache(self._kv_cache, slots.to(self._kv_cache.device), n)  # [T, n_layers, H]
        if hs.is_cuda:
            torch.cuda.synchronize(hs.device)
        tensors = {"hidden_states": hs.to("cpu", copy=True).contiguous(), "token_ids": pending.token_ids.clone()}
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        done = _Done()
        future = self._executor.submit(self._write_tensors, tensors, done, pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = done
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))
