"""Attention of training-time-test steps >= 1, in memory linear in the sequence length T.

Step ``j >= 1`` of the TTT unroll at row ``t`` attends to the step-0 keys of positions ``0..t`` (a causal block over
the base keys) plus its own row's keys of steps ``1..j`` (``j`` diagonal terms; the docstring of
``drafter/families/eagle3/model.py``).
Written out (:func:`ttt_attention_reference`, the implementation before this module) that is ``[B, h, T, T + j]``
scores, mask and softmax, and the softmax is saved for backward: memory quadratic in T (5.4e-4 MB/token^2 for an
8B-shaped drafter, ~43 GB at 8k tokens on top of the linear part; docs/benchmarks.md, "TTT memory").

:func:`ttt_attention_blockwise` computes the same function tile by tile with an online softmax, never holding more
than one ``[B, h, block, block]`` tile, and keeps only the output and the per-row log-sum-exp for backward; the
backward pass recomputes each tile's probabilities from them. Algorithm:

- Online softmax (Milakov & Gimelshein, 2018, "Online normalizer calculation for softmax", arXiv:1805.02867): a
  running row maximum ``m`` and normaliser ``l`` are rescaled by ``exp(m_old - m_new)`` as each key block arrives,
  so partial softmaxes merge exactly (the log-sum-exp merge); the diagonal terms are simply the first "block".
- Tiling with recomputation in backward (FlashAttention, Dao et al., 2022, arXiv:2205.14135; the backward in the
  form of FlashAttention-2, Dao, 2023, arXiv:2307.08691): with ``L`` the row log-sum-exp and
  ``D = rowsum(dO * O)``, each tile gives ``P = exp(S - L)``, ``dV += P^T dO``, ``dS = P * (dO V^T - D)``,
  ``dQ += dS K``, ``dK += dS^T Q`` (times the softmax scale).

Here in plain torch (no compiled kernel, so it runs the same on CPU and CUDA): each tile is a few batched matmuls
and elementwise ops, the loop over tiles is Python. Grouped-query attention is handled without ``repeat_kv``: the
``h / h_kv`` query heads that share a key head are folded into the tile's rows. Padding needs nothing here, exactly
as in the reference: batches are right-padded, so a real row's causal block never reaches a padded key, and rows
outside a sample are left out of the loss (``drafter/ttt.py``). Matmuls run in the inputs' dtype, softmax statistics
and accumulators in float32 (the reference's softmax is float32 too).

``train.ttt_attention`` picks the implementation (``blockwise`` by default; ``dense`` is the reference, kept for the
equivalence test and the memory benchmark, ``tests/drafter/test_ttt_blockwise.py``, ``bench/ttt_memory.py``).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from transformers.models.llama.modeling_llama import repeat_kv

# One layer's keys/values per draft step (as in the EAGLE-3 drafter): cache[step] = (k, v), each [B, h_kv, T, d].
LayerCache = list[tuple[torch.Tensor, torch.Tensor]]

MODES = ("blockwise", "dense")

# Elements of one score tile ([B, h, block, block]); 2**24 floats = 64 MiB in float32.
TILE_ELEMENTS = 2**24
MAX_BLOCK, MIN_BLOCK = 512, 64


def block_size(batch: int, heads: int, T: int) -> int:
    """Square tile edge: the largest power of two <= 512 (>= 64) whose ``[B, h, block, block]`` tile fits in
    :data:`TILE_ELEMENTS`, and no longer than the sequence."""
    edge = math.isqrt(max(1, TILE_ELEMENTS // max(1, batch * heads)))
    b = max(MIN_BLOCK, min(MAX_BLOCK, 1 << (edge.bit_length() - 1)))
    return max(1, min(b, T))


def ttt_attention_reference(q: torch.Tensor, cache: LayerCache) -> torch.Tensor:
    """The dense implementation (``train.ttt_attention: dense``): explicit ``[B, h, T, T + j]`` scores.

    Args:
        q: ``[B, h, T, d]`` this step's rotated queries. cache: the layer's keys/values of steps ``0..j``
            (this step's included), each ``[B, h_kv, T, d]``.

    Returns:
        ``[B, h, T, d]``.
    """
    T, d = q.shape[-2], q.shape[-1]
    rep = q.shape[1] // cache[0][0].shape[1]
    k0, v0 = repeat_kv(cache[0][0], rep), repeat_kv(cache[0][1], rep)  # [B, h, T, d]
    scale = 1.0 / math.sqrt(d)
    s0 = (q @ k0.transpose(-1, -2)) * scale  # [B, h, T, T]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    s0 = s0.masked_fill(~causal, float("-inf"))
    ks = [repeat_kv(kk, rep) for kk, _ in cache[1:]]
    vs = [repeat_kv(vv, rep) for _, vv in cache[1:]]
    sd = torch.stack([(q * kk).sum(-1) for kk in ks], dim=-1) * scale  # [B, h, T, j]
    p = torch.softmax(torch.cat([s0, sd], dim=-1).float(), dim=-1).to(q.dtype)  # [B, h, T, T + j]
    out = p[..., :T] @ v0  # [B, h, T, d]
    for i, vv in enumerate(vs):
        out = out + p[..., T + i, None] * vv
    return out


def ttt_attention_blockwise(q: torch.Tensor, cache: LayerCache, block: int | None = None) -> torch.Tensor:
    """Same result as :func:`ttt_attention_reference` in memory linear in T (module docstring).

    Args:
        q: ``[B, h, T, d]``. cache: keys/values of steps ``0..j`` (``j >= 1``), each ``[B, h_kv, T, d]``.
        block: tile edge; None = :func:`block_size`.

    Returns:
        ``[B, h, T, d]``.
    """
    B, h, T, _ = q.shape
    block = block or block_size(B, h, T)
    # one dtype for all: under autocast the steps' rotary tables follow their inputs' dtypes, so with the
    # EAGLE-3.1 norms a step's q can be float32 while step 0's keys are bf16 (autocast's matmul hid that)
    dt = q.dtype
    for kv in cache:
        dt = torch.promote_types(dt, torch.promote_types(kv[0].dtype, kv[1].dtype))
    diag = [t.to(dt) for kv in cache[1:] for t in kv]  # k1, v1, ..., kj, vj
    with torch.autocast(q.device.type, enabled=False):  # dtypes are chosen inside (see module docstring)
        return _BlockwiseTTT.apply(q.to(dt), cache[0][0].to(dt), cache[0][1].to(dt), block, *diag)


ATTENTION = {"blockwise": ttt_attention_blockwise, "dense": ttt_attention_reference}


def set_ttt_attention(model: nn.Module, mode: str) -> None:
    """Make every draft attention layer in ``model`` use ``mode`` (one of :data:`MODES`) for steps >= 1."""
    if mode not in MODES:
        raise ValueError(f"ttt attention {mode!r} is not one of {MODES}")
    for m in model.modules():
        if hasattr(m, "ttt_attention"):  # EAGLE-3's DraftAttention, not imported: it imports us
            m.ttt_attention = mode


def _causal_mask(qs: int, qe: int, ks: int, ke: int, device) -> torch.Tensor:
    """``[qe - qs, ke - ks]`` bool, True where the key comes after the query (masked out)."""
    qi = torch.arange(qs, qe, device=device)
    ki = torch.arange(ks, ke, device=device)
    return ki.unsqueeze(0) > qi.unsqueeze(1)


class _BlockwiseTTT(torch.autograd.Function):
    """Tiled forward and backward (module docstring). Shapes: ``q`` ``[B, h, T, d]``; ``k0``, ``v0`` and the
    diagonal ``k_i``, ``v_i`` ``[B, h_kv, T, d]``. Saved for backward: the inputs, the output and the row
    log-sum-exp ``[B, h, T]``: all linear in T."""

    @staticmethod
    def forward(ctx, q, k0, v0, block, *diag):
        B, h, T, d = q.shape
        hkv = k0.shape[1]
        rep = h // hkv
        scale = 1.0 / math.sqrt(d)
        ks, vs = diag[0::2], diag[1::2]
        f32 = torch.promote_types(q.dtype, torch.float32)  # statistics and accumulators (float64 stays float64)
        q5 = q.view(B, hkv, rep, T, d)  # query heads grouped by their key head (repeat_kv's order)
        out = torch.empty(B, hkv, rep, T, d, dtype=q.dtype, device=q.device)
        lse = torch.empty(B, hkv, rep, T, dtype=f32, device=q.device)
        for qs in range(0, T, block):
            qe = min(T, qs + block)
            C = qe - qs
            qc = q5[..., qs:qe, :] * scale  # [B, hkv, rep, C, d]
            # the diagonal terms first: j scores per row
            sd = torch.stack([(qc * k[:, :, None, qs:qe]).sum(-1) for k in ks], dim=-1).to(f32)  # [.., C, j]
            m = sd.amax(-1)  # [B, hkv, rep, C] running row maximum
            pd = torch.exp(sd - m.unsqueeze(-1))
            lsum = pd.sum(-1)  # running normaliser
            acc = sum(pd[..., i, None] * v[:, :, None, qs:qe].to(f32) for i, v in enumerate(vs))  # [.., C, d]
            q2 = qc.reshape(B, hkv, rep * C, d)
            for ks_ in range(0, qe, block):  # key blocks up to the diagonal
                ke = min(qe, ks_ + block)
                s = (q2 @ k0[:, :, ks_:ke].transpose(-1, -2)).to(f32).view(B, hkv, rep, C, ke - ks_)
                if ke - 1 > qs:
                    s = s.masked_fill(_causal_mask(qs, qe, ks_, ke, q.device), float("-inf"))
                m_new = torch.maximum(m, s.amax(-1))
                alpha = torch.exp(m - m_new)
                p = torch.exp(s - m_new.unsqueeze(-1))  # [B, hkv, rep, C, Kb]
                lsum = lsum * alpha + p.sum(-1)
                pv = p.view(B, hkv, rep * C, ke - ks_).to(v0.dtype) @ v0[:, :, ks_:ke]  # [B, hkv, rep*C, d]
                acc = acc * alpha.unsqueeze(-1) + pv.view(B, hkv, rep, C, d).to(f32)
                m = m_new
            out[..., qs:qe, :] = (acc / lsum.unsqueeze(-1)).to(q.dtype)
            lse[..., qs:qe] = m + torch.log(lsum)
        out = out.view(B, h, T, d)
        ctx.save_for_backward(q, k0, v0, out, lse, *diag)
        ctx.block = block
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k0, v0, out, lse, *diag = ctx.saved_tensors
        block = ctx.block
        B, h, T, d = q.shape
        hkv = k0.shape[1]
        rep = h // hkv
        scale = 1.0 / math.sqrt(d)
        ks, vs = diag[0::2], diag[1::2]
        f32 = torch.promote_types(q.dtype, torch.float32)
        q5 = q.view(B, hkv, rep, T, d)
        g5 = grad.reshape(B, hkv, rep, T, d)
        D = (g5.to(f32) * out.view(B, hkv, rep, T, d).to(f32)).sum(-1)  # [B, hkv, rep, T] rowsum(dO * O)
        dq = torch.empty(B, hkv, rep, T, d, dtype=f32, device=q.device)
        dk0 = torch.zeros(k0.shape, dtype=f32, device=q.device)
        dv0 = torch.zeros(v0.shape, dtype=f32, device=q.device)
        dks = [torch.zeros(k.shape, dtype=f32, device=q.device) for k in ks]
        dvs = [torch.zeros(v.shape, dtype=f32, device=q.device) for v in vs]
        for qs in range(0, T, block):
            qe = min(T, qs + block)
            C = qe - qs
            qc = q5[..., qs:qe, :] * scale  # [B, hkv, rep, C, d]
            gc = g5[..., qs:qe, :]
            gcf = gc.to(f32)
            Dc, Lc = D[..., qs:qe], lse[..., qs:qe]  # [B, hkv, rep, C]
            dqc = torch.zeros(B, hkv, rep, C, d, dtype=f32, device=q.device)
            for i, (k, v) in enumerate(zip(ks, vs, strict=True)):
                kc, vc = k[:, :, None, qs:qe].to(f32), v[:, :, None, qs:qe].to(f32)  # [B, hkv, 1, C, d]
                p = torch.exp((qc * k[:, :, None, qs:qe]).sum(-1).to(f32) - Lc)  # [B, hkv, rep, C]
                dvs[i][:, :, qs:qe] += (p.unsqueeze(-1) * gcf).sum(2)
                ds = p * ((gcf * vc).sum(-1) - Dc)
                dqc += ds.unsqueeze(-1) * kc
                dks[i][:, :, qs:qe] += (ds.unsqueeze(-1) * qc.to(f32)).sum(2)
            q2 = qc.reshape(B, hkv, rep * C, d)
            g2 = gc.reshape(B, hkv, rep * C, d)
            for ks_ in range(0, qe, block):
                ke = min(qe, ks_ + block)
                Kb = ke - ks_
                kb, vb = k0[:, :, ks_:ke], v0[:, :, ks_:ke]  # [B, hkv, Kb, d]
                s = (q2 @ kb.transpose(-1, -2)).to(f32).view(B, hkv, rep, C, Kb)
                if ke - 1 > qs:
                    s = s.masked_fill(_causal_mask(qs, qe, ks_, ke, q.device), float("-inf"))
                p = torch.exp(s - Lc.unsqueeze(-1))  # [B, hkv, rep, C, Kb]
                dv0[:, :, ks_:ke] += p.view(B, hkv, rep * C, Kb).transpose(-1, -2).to(g2.dtype) @ g2
                dp = (g2 @ vb.transpose(-1, -2)).to(f32).view(B, hkv, rep, C, Kb)
                ds = (p * (dp - Dc.unsqueeze(-1))).view(B, hkv, rep * C, Kb).to(q.dtype)
                dqc += (ds @ kb).view(B, hkv, rep, C, d).to(f32)
                dk0[:, :, ks_:ke] += ds.transpose(-1, -2) @ q2
            dq[..., qs:qe, :] = dqc * scale
        grads = [dq.view(B, h, T, d).to(q.dtype), dk0.to(k0.dtype), dv0.to(v0.dtype), None]
        for dk, dv, k, v in zip(dks, dvs, ks, vs, strict=True):
            grads += [dk.to(k.dtype), dv.to(v.dtype)]
        return tuple(grads)
