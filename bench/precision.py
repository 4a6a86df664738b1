"""Benchmark: bf16 (candidate) vs float32 (baseline) for each compute stage on this CPU, in one process.

What ``draftsmith.precision``'s ``auto`` rule rests on. Three measurements, each baseline then candidate:

- ``serve``: output tokens/s of vLLM's CPU build on the embedded SmolLM2 (two servers started here, compiled, one
  after the other; 64 synthetic questions, 128 new tokens each with ``ignore_eos``, concurrency 64);
- ``extract``: tokens/s of the transformers forward with ``output_hidden_states`` (what the hf extractor runs),
  8 x 512 tokens;
- ``train``: tokens/s of one TTT-3 training step of the drafter (forward, backward, AdamW; draft vocabulary
  8,192, micro-batch 4 x 1,024 random tokens), float32 vs ``torch.autocast`` bf16.

    .venv/bin/python bench/precision.py [--skip-serve]

Prints ``RATIO precision_<stage> <bf16 / float32>`` per stage (above 1: bf16 is faster here).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path


def serve_tok_s(target: Path, dtype: str, n: int = 64, max_tokens: int = 128) -> float:
    """Output tokens/s of one vLLM CPU server at ``dtype`` (started and stopped here)."""
    import httpx
    from draftsmith.target.server import VLLMServer, VLLMServerSpec, free_port

    spec = VLLMServerSpec(model=target, served_name="t", port=free_port(), dtype=dtype, max_model_len=2048,
                          kv_cache_gib=2)
    log = Path(f"/tmp/bench-precision-vllm-{dtype}.log")
    server = VLLMServer(spec, log).start(timeout_s=900)
    try:
        async def run() -> float:
            async with httpx.AsyncClient(timeout=600) as c:
                async def one(q: str) -> int:
                    r = await c.post(f"{server.url}/v1/chat/completions", json={
                        "model": "t", "messages": [{"role": "user", "content": q}], "max_tokens": max_tokens,
                        "temperature": 0, "ignore_eos": True})
                    r.raise_for_status()
                    return int(r.json()["usage"]["completion_tokens"])

                await one("warm up")
                t0 = time.perf_counter()
                tokens = sum(await asyncio.gather(*(one(f"Question {i}: what is {7 * i} plus {13 * i}? Explain.")
                                                    for i in range(n))))
                return tokens / (time.perf_counter() - t0)

        return asyncio.run(run())
    finally:
        server.stop()


def extract_tok_s(target: Path, dtype: str, batch: int = 8, length: int = 512) -> float:
    """Tokens/s of the target's forward with every hidden state, as the hf extractor runs it."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target, dtype=getattr(torch, dtype)).eval()
    x = torch.randint(0, 40000, (batch, length))
    with torch.no_grad():
        model.model(input_ids=x[:2, :128], output_hidden_states=True)
        t0 = time.perf_counter()
        for _ in range(3):
            model.model(input_ids=x, output_hidden_states=True)
    return 3 * batch * length / (time.perf_counter() - t0)


def train_tok_s(target: Path, bf16: bool, batch: int = 4, length: int = 1024) -> float:
    """Tokens/s of TTT-3 training steps of a drafter with an 8,192-token draft vocabulary."""
    import torch
    from draftsmith.drafter.config import derive_config
    from draftsmith.drafter.families.eagle3.model import Eagle3Drafter
    from draftsmith.drafter.ttt import target_view, ttt_loss

    torch.manual_seed(0)
    cfg = derive_config(target, 8192, norm_before_residual=True)
    model = Eagle3Drafter(cfg)
    opt = torch.optim.AdamW(model.trainable_parameters(), lr=1e-4)
    h, v = cfg.hidden_size, cfg.vocab_size
    ids = torch.randint(0, 8000, (batch, length))
    aux = torch.randn(batch, length, 3 * h).bfloat16()
    lengths = torch.full((batch,), length)
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[:8192] = True
    view = target_view(torch.randn(batch, length, h), torch.randn(v, h) * 0.02, torch.zeros(8192, dtype=torch.long),
                       t2d)
    steps, t0 = 3, 0.0
    for i in range(steps + 1):
        if i == 1:
            t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss, _ = ttt_loss(model, ids, torch.ones(batch, length), aux, lengths, view, 3, all_rows=True)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return steps * batch * length / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-serve", action="store_true", help="skip the two vLLM servers (~4 minutes)")
    args = ap.parse_args()

    from draftsmith.precision import cpu_has_amx
    from draftsmith.target.embedded import embedded_dir, prepare_embedded

    cache = Path.home() / ".cache" / "draftsmith"
    prepare_embedded(cache)
    target = embedded_dir(cache)
    print(f"CPU with AMX: {cpu_has_amx()} (auto picks {'bfloat16' if cpu_has_amx() else 'float32'})")
    rows = []
    if not args.skip_serve:
        rows.append(("serve", serve_tok_s(target, "float32"), serve_tok_s(target, "bfloat16")))
    rows.append(("extract", extract_tok_s(target, "float32"), extract_tok_s(target, "bfloat16")))
    rows.append(("train", train_tok_s(target, False), train_tok_s(target, True)))
    for name, base, cand in rows:
        print(f"{name}: float32 {base:.0f} tok/s, bf16 {cand:.0f} tok/s")
    for name, base, cand in rows:
        print(f"RATIO precision_{name} {cand / base:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
