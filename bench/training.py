"""Training throughput of the SmolLM2 EAGLE-3 drafter (TTT k=7) against a plain matmul, in one process.

Candidate: full optimizer steps (TTT unroll, soft-CE loss over the draft vocabulary, backward, clipping, AdamW) on
random features of SmolLM2's shape; reported as tokens/s and achieved FLOP/s (counted analytically: matmuls of
every step, attention over the computed T x T scores, backward = 2 x forward). Baseline: ``torch.matmul`` of the
drafter's MLP shape ``[B*T, H] @ [H, I]``, measured in the same process. Last line: ``RATIO training <flops ratio>``
(goal >= 0.30 on CPU).

Usage: ``python bench/training.py [--batch 4] [--seq 256] [--steps 3] [--vocab 8192] [--k 7]``
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import torch


def drafter_flops_per_token(cfg, k: int, T: int) -> float:
    """Training FLOPs per token of a k-step TTT unroll (forward x 3)."""
    H, inter, N = cfg.hidden_size, cfg.intermediate_size, cfg.draft_vocab_size
    h, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    step = 2 * (2 * H * (h * d + 2 * hkv * d) + h * d * H + 3 * H * inter + H * N)  # qkv, o, mlp, lm_head
    attn = 4 * T * h * d  # scores + weighted values over the T computed columns
    fc = 2 * 3 * cfg.target_hidden_size * H
    return 3.0 * (fc + k * (step + attn))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--k", type=int, default=7)
    ap.add_argument("--target", default=str(Path.home() / ".cache/draftsmith/models/SmolLM2-135M-Instruct"))
    a = ap.parse_args()
    from draftsmith.drafter.config import derive_config
    from draftsmith.drafter.families.eagle3.model import Eagle3Drafter
    from draftsmith.drafter.ttt import target_view, ttt_loss

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = derive_config(a.target, a.vocab)
    torch.manual_seed(0)
    model = Eagle3Drafter(cfg).to(dev)
    V, H, B, T = cfg.vocab_size, cfg.hidden_size, a.batch, a.seq
    with torch.no_grad():
        model.d2t.copy_(torch.arange(a.vocab, device=dev) * (V // a.vocab) - torch.arange(a.vocab, device=dev))
        model.t2d[torch.arange(a.vocab, device=dev) * (V // a.vocab)] = True
    head = torch.randn(V, H, device=dev) * 0.05
    ids = torch.randint(0, V, (B, T), device=dev)
    mask = torch.ones(B, T, dtype=torch.bool, device=dev)
    aux = torch.randn(B, T, 3 * H, device=dev)
    fin = torch.randn(B, T, H, device=dev)
    lengths = torch.full((B,), T, device=dev)
    opt = torch.optim.AdamW(model.trainable_parameters(), lr=1e-4, betas=(0.9, 0.95))
    view = target_view(fin, head, model.d2t, model.t2d)  # cached per sample by the trainer

    def train_step():
        loss, _ = ttt_loss(model, ids, mask, aux, lengths, view, a.k)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.trainable_parameters(), 0.5)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    train_step()  # warm-up
    sync()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        train_step()
    sync()
    dt = (time.perf_counter() - t0) / a.steps
    tok_s = B * T / dt
    flops = drafter_flops_per_token(cfg, a.k, T) * tok_s

    x = torch.randn(B * T, H, device=dev)
    w = torch.randn(H, cfg.intermediate_size, device=dev)
    torch.matmul(x, w)
    sync()
    reps = 20
    t0 = time.perf_counter()
    for _ in range(reps):
        torch.matmul(x, w)
    sync()
    mm = 2 * B * T * H * cfg.intermediate_size * reps / (time.perf_counter() - t0)
    if dev.type == "cuda":
        peak = f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB (GPU)"
    else:
        peak = f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB (process max RSS)"
    print(f"device {dev} threads {torch.get_num_threads()} batch {B} seq {T} k {a.k} draft_vocab {a.vocab}")
    print(f"drafter training: {tok_s:,.0f} tokens/s, {dt:.2f} s/step, {flops / 1e9:.1f} GFLOP/s")
    print(f"baseline matmul [{B * T}x{H}]@[{H}x{cfg.intermediate_size}]: {mm / 1e9:.1f} GFLOP/s")
    print(f"peak memory {peak}")
    print(f"RATIO training {flops / mm:.3f}")


if __name__ == "__main__":
    main()
