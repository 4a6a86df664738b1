"""The extractor refuses, in one line, GPUs that the target service still holds. There is no GPU here: the free
memory per device comes from a stand-in for ``torch.cuda.mem_get_info`` with the numbers an 8 x 96 GB host shows
while the target service runs (about 86 of 96 GB used per GPU) and after it stopped."""

from __future__ import annotations

import json

import pytest
from draftsmith.errors import EngineError
from draftsmith.features.jobs import require_free_gpus

GB = 1e9


def target_with_weights(tmp_path, total_size: int):
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total_size}}))
    return tmp_path


def test_busy_gpus_are_refused_with_the_fix(tmp_path):
    kimi = target_with_weights(tmp_path, 595 * 10**9)
    busy = {i: (10 * GB, 96 * GB) for i in range(8)}
    busy[3] = (90 * GB, 96 * GB)
    with pytest.raises(EngineError) as e:
        require_free_gpus(kimi, list(range(8)), mem_get_info=busy.__getitem__)
    msg = str(e.value)
    assert "81.8 GB on each of GPUs [0, 1, 2, 3, 4, 5, 6, 7]" in msg and "GPU 0: 10.0 GB free" in msg
    assert "GPU 3" not in msg and "stop target-vllm target-sglang" in msg
    idle = {i: (95 * GB, 96 * GB) for i in range(8)}
    require_free_gpus(kimi, list(range(8)), mem_get_info=idle.__getitem__)


def test_nothing_to_check_without_gpus_or_a_weight_index(tmp_path):
    require_free_gpus(target_with_weights(tmp_path, 10**12), [], mem_get_info=lambda i: (0, 0))
    require_free_gpus(tmp_path / "nothing", [0], mem_get_info=lambda i: (0, 0))
