"""The one dtype rule (draftsmith.precision): bf16 on CUDA and AMX CPUs, float32 on other CPUs, for every stage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from draftsmith import precision
from draftsmith.config import Settings
from draftsmith.demo_sizes import SIZES
from draftsmith.target.server import VLLMServerSpec


@pytest.fixture
def amx(monkeypatch):
    """Pretend this CPU has (``amx(True)``) or lacks (``amx(False)``) AMX tiles."""

    def set_amx(flag: bool) -> None:
        monkeypatch.setattr(precision, "cpu_has_amx", lambda: flag)

    return set_amx


def test_the_probe_agrees_with_the_kernels_flags():
    """torch's probe and /proc/cpuinfo name the same thing on this machine (both kinds of CPU run CI here)."""
    flags = Path("/proc/cpuinfo").read_text()
    assert precision.cpu_has_amx() == (" amx_bf16" in flags)


def test_auto_is_bf16_on_amx_and_float32_elsewhere(amx):
    amx(True)
    assert precision.compute_dtype("auto", "cpu") == "bfloat16"
    assert precision.native_bf16(torch.device("cpu")) is True
    amx(False)
    assert precision.compute_dtype("auto", "cpu") == "float32"
    assert precision.native_bf16("cpu") is False
    assert precision.compute_dtype("auto", "cuda:1") == "bfloat16"  # any CUDA device computes bf16
    for name in ("float32", "bfloat16", "float16"):
        assert precision.compute_dtype(name, "cpu") == name  # an explicit dtype is never changed


def test_the_default_settings_resolve_through_the_rule(amx, monkeypatch):
    s = Settings()
    assert (s.target.dtype, s.extract.compute_dtype, s.train.precision) == ("auto", "auto", "auto")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    amx(False)
    assert precision.serving_dtype(s.target.dtype) == "float32"
    amx(True)
    assert precision.serving_dtype(s.target.dtype) == "bfloat16"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert precision.serving_dtype("auto") == "auto"  # on a GPU the engine keeps the checkpoint's dtype


def test_the_server_command_carries_the_resolved_dtype(tmp_path, amx, monkeypatch):
    """vLLM's own ``--dtype auto`` would serve SmolLM2 in bf16 on an AVX2 CPU (several times slower); the command
    carries draftsmith's choice instead, and the float32 MLA pin follows it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    mla = tmp_path / "mla"
    mla.mkdir()
    (mla / "config.json").write_text(json.dumps({"kv_lora_rank": 512}))

    def arg(cmd: list[str], flag: str) -> str | None:
        return cmd[cmd.index(flag) + 1] if flag in cmd else None

    amx(False)
    cmd = VLLMServerSpec(model=mla).command()
    assert arg(cmd, "--dtype") == "float32" and arg(cmd, "--attention-backend") == "CPU_MLA"
    amx(True)
    cmd = VLLMServerSpec(model=mla).command()
    assert arg(cmd, "--dtype") == "bfloat16" and arg(cmd, "--attention-backend") is None


def test_the_default_demo_buys_more_data_where_bf16_is_native(amx):
    size = SIZES["default"]
    amx(False)
    assert size.for_this_machine() is size
    amx(True)
    fast = size.for_this_machine()
    assert sum(fast.pools.values()) > 2 * sum(size.pools.values())
    assert fast.config["train"]["epochs"] == 2 and fast.config["train"]["lr"] == size.config["train"]["lr"]
    assert fast.config["generation"]["max_tokens"] == 320 and fast.config["generation"]["batch_size"] == 16
    assert size.config["generation"]["max_tokens"] == 256  # the original is not modified
    for name in ("small", "mla"):
        assert SIZES[name].for_this_machine() is SIZES[name]
    mla = SIZES["mla"].config
    assert (mla["target"]["dtype"], mla["extract"]["compute_dtype"], mla["train"]["precision"]) == (
        "float32", "float32", "fp32")


def test_bf16_on_a_cpu_that_emulates_it_is_warned_about(amx, monkeypatch, tmp_path):
    """Forced bf16 where products are emulated gets a warning naming the fix; hardware bf16, float32, auto and CUDA
    get none."""
    cpuinfo = tmp_path / "cpuinfo"
    monkeypatch.setattr(precision, "CPUINFO", str(cpuinfo))
    cpuinfo.write_text("flags\t\t: fpu avx2 avx512f\n")
    amx(False)
    msg = precision.emulated_bf16_warning("bf16")
    assert msg and "no AMX, no AVX-512-BF16" in msg and "auto or fp32" in msg
    assert precision.emulated_bf16_warning("bfloat16", torch.device("cpu")).startswith("bfloat16 on a CPU")
    for ok in ("fp32", "float32", "auto"):
        assert precision.emulated_bf16_warning(ok) is None
    assert precision.emulated_bf16_warning("bf16", "cuda") is None
    cpuinfo.write_text("flags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert precision.emulated_bf16_warning("bf16") is None
    cpuinfo.write_text("flags\t\t: fpu avx2\n")
    amx(True)
    assert precision.emulated_bf16_warning("bf16") is None
