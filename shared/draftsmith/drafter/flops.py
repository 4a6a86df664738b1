"""Training FLOPs of an EAGLE-3 drafter, counted from its shapes, and the model FLOPs utilisation (MFU) they give.

Counted per trained token, forward pass, as 2 FLOPs per multiply-add of every matmul (the convention of PaLM's MFU,
Chowdhery et al. 2022, appendix B, and of nanoGPT's ``estimate_mfu``):

- ``fc``: ``3 H_t -> H`` once (TTT step 0 only);
- per TTT step and decoder layer: q, k, v from the ``2 H`` input (embedding | hidden), o, the gated MLP
  (``3 H I``), and attention over the context (scores and weighted sum: ``2 * 2 * h * d * T_ctx``, ``T_ctx`` = the
  mean causal context ``T / 2`` plus the step's extra diagonal keys);
- the output head over the draft vocabulary, per TTT step.

Backward costs twice the forward (gradients of activations and of weights; the frozen embedding's weight gradient
is not computed, a difference below 1 % for these shapes), so a step is ``3 x forward``. Peak device FLOP/s come
from ``train.peak_tflops`` or, for GPUs whose dense bf16 peak is published, from :data:`PEAK_BF16_TFLOPS`;
elsewhere MFU is not shown.
"""

from __future__ import annotations

PEAK_BF16_TFLOPS = {  # dense (no sparsity) bf16 tensor-core peaks from the vendors' data sheets
    "A100": 312.0,
    "H100": 989.0,
    "H200": 989.0,
    "B200": 2250.0,
}


def forward_flops_per_token(cfg, seq_len: int, ttt_steps: int) -> float:
    """Forward FLOPs per token of one training step (all ``ttt_steps`` unrolled) at sequence length ``seq_len``.

    Args:
        cfg: a :class:`~draftsmith.drafter.config.DraftConfig`.
        seq_len: tokens per sample (the causal attention's mean context is ``seq_len / 2``).
        ttt_steps: the TTT depth ``k``.
    """
    h, hq, hkv, d = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    aux = len(cfg.layer_ids) * cfg.target_hidden_size
    fc = 2 * aux * h
    proj = 2 * (2 * h) * (hq * d + 2 * hkv * d) + 2 * (hq * d) * h
    mlp = 2 * 3 * h * cfg.intermediate_size
    head = 2 * h * cfg.draft_vocab_size
    total = fc
    for j in range(ttt_steps):
        ctx = seq_len / 2 + j  # causal keys on average, plus the diagonal keys of the earlier steps
        attn = 2 * 2 * hq * d * ctx
        total += cfg.num_layers * (proj + mlp + attn) + head
    return float(total)


def train_flops_per_token(cfg, seq_len: int, ttt_steps: int) -> float:
    """Forward plus backward FLOPs per token: ``3 x`` :func:`forward_flops_per_token`."""
    return 3.0 * forward_flops_per_token(cfg, seq_len, ttt_steps)


def peak_flops(device: str, peak_tflops: float | None = None) -> float | None:
    """Peak FLOP/s of ``device`` (``cuda:0``, ``cpu``): ``peak_tflops`` when given, else the published dense bf16
    peak of a known GPU (its name from ``torch.cuda.get_device_name``), else None (unknown: no MFU)."""
    if peak_tflops:
        return peak_tflops * 1e12
    if not str(device).startswith("cuda"):
        return None
    import torch

    name = torch.cuda.get_device_name(torch.device(device))
    for key, tf in PEAK_BF16_TFLOPS.items():
        if key in name:
            return tf * 1e12
    return None


def mfu(tokens_per_s: float, flops_per_token: float, world: int, peak: float | None) -> float | None:
    """Model FLOPs utilisation: achieved training FLOP/s over ``world`` devices' peak; None when the peak is
    unknown."""
    if not peak:
        return None
    return tokens_per_s * flops_per_token / (peak * max(world, 1))
