"""Muon's Newton-Schulz orthogonalisation in float32, for CPUs that emulate bf16.

PyTorch's ``torch.optim.Muon`` (``torch/optim/_muon.py``, after Keller Jordan's Muon, 2024) runs its Newton-Schulz
iteration in bf16. That is cheap where bf16 products run in hardware (CUDA, AMX, AVX-512-BF16) and ruinous where
they are emulated: on a 2-core AMD EPYC with AVX2 only, five iterations for one 576 x 1,728 matrix (the SmolLM2
drafter's ``fc``) took 4.6 s in bf16, so an optimizer step of the whole drafter took about 25 s and an epoch of
550 samples about an hour, for a few seconds of float32 work (docs/benchmarks.md, "Muon on a CPU without bf16
kernels"). :func:`float32_newton_schulz` runs the same iteration, with the same coefficients and steps, in float32
while a Muon step runs; :class:`~draftsmith.drafter.optimizer.Optimizers` uses it where
:func:`~draftsmith.precision.cpu_has_bf16_kernels` says no. This module imports nothing but torch, so the peer
comparison's launcher (``bench/peer_launch.py``) loads it by path and gives the peer's Muon the same arithmetic.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

# where torch.optim.Muon looks the iteration up on every step (a private name: checked, never assumed)
MUON_MODULE = "torch.optim._muon"
MUON_NS = "_zeropower_via_newtonschulz"


def newton_schulz_float32(grad: torch.Tensor, ns_coefficients: tuple[float, float, float], ns_steps: int,
                          eps: float) -> torch.Tensor:
    """``grad`` ``[m, n]`` -> its approximate orthogonalisation ``[m, n]`` float32: torch's Muon iteration (the
    quintic ``X <- a X + (b A + c A^2) X``, ``A = X X^T``, on the wider orientation, after scaling to unit Frobenius
    norm), computed in float32 instead of bf16. Same arguments as torch's ``_zeropower_via_newtonschulz``.

    Raises:
        ValueError: ``grad`` is not 2-D.
    """
    if grad.ndim != 2:
        raise ValueError(f"Newton-Schulz needs a 2-D matrix, got shape {tuple(grad.shape)}")
    a, b, c = ns_coefficients
    tall = grad.size(0) > grad.size(1)
    x = grad.float().T if tall else grad.float()  # [short, long]
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T  # [short, short]
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


@contextlib.contextmanager
def float32_newton_schulz(enabled: bool = True) -> Iterator[bool]:
    """While the block runs, ``torch.optim.Muon`` orthogonalises with :func:`newton_schulz_float32`; yields whether
    it does (False when not ``enabled``, or when this torch has no such function to replace: then its own runs)."""
    import importlib

    module = importlib.import_module(MUON_MODULE)
    own = getattr(module, MUON_NS, None)
    if not enabled or own is None:
        yield False
        return
    setattr(module, MUON_NS, newton_schulz_float32)
    try:
        yield True
    finally:
        setattr(module, MUON_NS, own)
