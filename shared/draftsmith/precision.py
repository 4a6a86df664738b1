"""One rule for the compute dtype of every stage: bf16 where the hardware computes it natively, float32 elsewhere.

Measured on the two kinds of 2-core machine this project runs on (docs/benchmarks.md, "bf16 on a CPU with AMX"):
on an Intel Xeon with AMX tiles, bf16 against float32 is 2.6x the output tokens/s of vLLM's CPU build, 3.6x the
tokens/s of the transformers forward used for extraction and 1.7x the tokens/s of drafter training (autocast); on
an AMD EPYC with AVX2 only, bf16 is several times *slower* than float32 (vLLM: 24-44 against 194 tok/s,
measured on that machine and recorded in the
same section), because there every bf16 product is emulated. So ``auto`` means bf16 on CUDA
and on CPUs with AMX, float32 on other CPUs. AVX-512-BF16 without AMX is not measured here and stays float32.

The same rule is applied to serving (``target.dtype``), extraction (``extract.compute_dtype``) and training
(``train.precision``) so that the features a drafter trains on and the engine that serves it use one dtype.
"""

from __future__ import annotations

from functools import lru_cache

import torch


@lru_cache(maxsize=1)
def cpu_has_amx() -> bool:
    """True when this CPU has AMX tiles with bf16 (``amx_bf16``), which oneDNN and vLLM's CPU build use for bf16.

    Reads torch's own CPU feature probe (``torch.cpu._is_amx_tile_supported``, private but present in torch 2.3+),
    then ``/proc/cpuinfo``'s ``amx_bf16`` flag where that probe is missing; False when neither can tell.
    """
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    if probe is not None:
        try:
            return bool(probe())
        except Exception:  # noqa: BLE001 - a probe that fails means "unknown": keep the safe float32
            return False
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return any(line.startswith("flags") and " amx_bf16" in line for line in f)
    except OSError:
        return False


def native_bf16(device: str | torch.device = "cpu") -> bool:
    """True when ``device`` computes bf16 natively: any CUDA device, or a CPU with AMX (:func:`cpu_has_amx`)."""
    kind = torch.device(device).type if not isinstance(device, torch.device) else device.type
    if kind == "cuda":
        return True
    return kind == "cpu" and cpu_has_amx()


def compute_dtype(name: str, device: str | torch.device = "cpu") -> str:
    """Resolve a configured dtype name: ``"auto"`` -> ``"bfloat16"`` where :func:`native_bf16`, else ``"float32"``.

    Any other name (``float32``, ``bfloat16``, ``float16``) is returned unchanged.
    """
    if name != "auto":
        return name
    return "bfloat16" if native_bf16(device) else "float32"


def serving_dtype(name: str) -> str:
    """The ``--dtype`` for a vLLM or SGLang server started on this machine.

    ``"auto"`` -> ``"auto"`` (the engine's own choice, the checkpoint's dtype) when CUDA is visible; otherwise the
    CPU rule of :func:`compute_dtype`. Other names pass through unchanged.
    """
    if name != "auto":
        return name
    if torch.cuda.is_available():
        return "auto"
    return compute_dtype("auto", "cpu")


CPUINFO = "/proc/cpuinfo"


def cpu_has_bf16_kernels() -> bool:
    """True when this CPU computes bf16 products in hardware: AMX (:func:`cpu_has_amx`) or AVX-512-BF16 (the
    ``avx512_bf16`` flag of ``/proc/cpuinfo``). Without either, PyTorch emulates them: measured on a 2-core AVX2 EPYC,
    a 2,048 x 576 by 576 x 8,192 product took 45 s in bf16 against 0.31 s in float32 (docs/benchmarks.md)."""
    if cpu_has_amx():
        return True
    try:
        with open(CPUINFO, encoding="utf-8") as f:
            return any(line.startswith("flags") and " avx512_bf16" in line for line in f)
    except OSError:
        return False


def emulated_bf16_warning(precision: str, device: str | torch.device = "cpu") -> str | None:
    """The warning for a bf16 ``precision`` (``bf16`` or ``bfloat16``) on a CPU that emulates bf16
    (:func:`cpu_has_bf16_kernels`), else None: the setting is honoured, but every product runs ~100x slower."""
    kind = torch.device(device).type if not isinstance(device, torch.device) else device.type
    if precision not in ("bf16", "bfloat16") or kind != "cpu" or cpu_has_bf16_kernels():
        return None
    return (f"{precision} on a CPU without bf16 kernels (no AMX, no AVX-512-BF16): every bf16 product is emulated, "
            "about 100x slower than float32 here; set it to auto or fp32/float32 unless bf16 arithmetic is the point")

