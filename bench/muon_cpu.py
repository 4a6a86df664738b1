"""Benchmark: Muon's Newton-Schulz in float32 (candidate) vs torch's own bf16 (baseline), in one process.

What ``drafter/newton_schulz.py`` rests on. One float32 training step of the SmolLM2 drafter (TTT-3 forward and
backward, draft vocabulary 8,192, micro-batch 4 x 1,024 random tokens) followed by ``Optimizers.step`` with the demo
recipe's Muon + AdamW, timed with torch's bf16 iteration and with the float32 one; the optimizer step is also timed
alone. On a CPU with bf16 kernels (AMX, AVX-512-BF16) the two are close and draftsmith keeps torch's; without them
the bf16 iteration is emulated.

    .venv/bin/python bench/muon_cpu.py [--steps 2]

Prints ``RATIO muon_ns_float32_step <baseline s / candidate s>`` for the whole training step and
``RATIO muon_ns_float32_optimizer`` for the optimizer step alone (above 1: float32 is faster here).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from types import SimpleNamespace


def step_times(target: Path, ns_float32: bool, steps: int, batch: int = 4, length: int = 1024) -> tuple[float, float]:
    """(seconds per training step, seconds per optimizer step) of the drafter with Muon, averaged over ``steps``
    after one warm-up step."""
    import torch
    from draftsmith.demo_sizes import RECIPE
    from draftsmith.drafter.config import derive_config
    from draftsmith.drafter.families.eagle3.model import Eagle3Drafter
    from draftsmith.drafter.optimizer import Optimizers
    from draftsmith.drafter.ttt import target_view, ttt_loss

    torch.manual_seed(0)
    cfg = derive_config(target, 8192, norm_before_residual=True)
    model = Eagle3Drafter(cfg)
    tc = SimpleNamespace(optimizer="muon", lr=1e-3, betas=(0.9, 0.95), weight_decay=0.0, muon_lr=RECIPE["muon_lr"],
                         muon_momentum=0.95, muon_weight_decay=0.1)
    opt = Optimizers(model, tc)
    opt.ns_float32 = ns_float32  # both ways on this CPU, whatever its kernels
    h, v = cfg.hidden_size, cfg.vocab_size
    ids = torch.randint(0, 8000, (batch, length))
    aux = torch.randn(batch, length, 3 * h)
    lengths = torch.full((batch,), length)
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[:8192] = True
    view = target_view(torch.randn(batch, length, h), torch.randn(v, h) * 0.02, torch.zeros(8192, dtype=torch.long),
                       t2d)
    total = opt_s = 0.0
    for i in range(steps + 1):
        t0 = time.perf_counter()
        loss, _ = ttt_loss(model, ids, torch.ones(batch, length), aux, lengths, view, 3, all_rows=True)
        loss.backward()
        t1 = time.perf_counter()
        opt.step()
        opt.zero_grad()
        t2 = time.perf_counter()
        if i:  # the first step warms up
            total, opt_s = total + t2 - t0, opt_s + t2 - t1
    return total / steps, opt_s / steps


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2, help="timed steps per side (after one warm-up)")
    args = ap.parse_args()

    from draftsmith.precision import cpu_has_amx, cpu_has_bf16_kernels
    from draftsmith.target.embedded import embedded_dir, prepare_embedded

    cache = Path.home() / ".cache" / "draftsmith"
    prepare_embedded(cache)
    target = embedded_dir(cache)
    print(f"CPU: AMX {cpu_has_amx()}, bf16 kernels {cpu_has_bf16_kernels()}; draftsmith's choice here: "
          f"{'torch bf16' if cpu_has_bf16_kernels() else 'float32'} Newton-Schulz")
    base = step_times(target, False, args.steps)
    cand = step_times(target, True, args.steps)
    print(f"baseline (torch, bf16 Newton-Schulz): {base[0]:.2f} s per step, optimizer {base[1]:.2f} s")
    print(f"candidate (float32 Newton-Schulz):    {cand[0]:.2f} s per step, optimizer {cand[1]:.2f} s")
    print(f"RATIO muon_ns_float32_step {base[0] / cand[0]:.2f}")
    print(f"RATIO muon_ns_float32_optimizer {base[1] / cand[1]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
