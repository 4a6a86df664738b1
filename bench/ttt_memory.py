"""Memory and time of one EAGLE-3 drafter training step against the sequence length: blockwise TTT attention and
chunked loss (``train.ttt_attention: blockwise``, ``train.ttt_loss: chunked``, the defaults) vs the dense reference.

Each measurement runs in a fresh Python process (``--child``), one after another, so no point sees another's heap.
Measured: peak resident memory of the step above the resident memory just before it. The process resets its
kernel high-water mark right before the step (``echo 5 > /proc/self/clear_refs``, Linux >= 4.0) and reads
``VmHWM`` after it; without clear_refs it falls back to ``ru_maxrss`` minus the RSS before the step (an upper bound
only when nothing before the step peaked higher). One step = ``target_view`` of the batch (the trainer computes it
per micro-batch) + the TTT forward (depth 3) + backward; gradient buffers are created by that backward, as in the
trainer (``zero_grad(set_to_none=True)``), so they count in the step. Batch of one sequence, float32, random
weights and features, glibc's default allocator (as the trainer leaves it for micro-batches above 2,048 tokens;
``--allocator keep``: ``draftsmith.allocator.keep_freed_memory``, the trainer's setting up to 2,048).

Points (``python bench/ttt_memory.py``; ``--quick``: small T, a smoke run of a few minutes):

1. Attention-dominated 8B-shaped drafter layer (hidden 4096, 32/8 heads, head dim 128, MLP 1024, draft vocabulary
   4096): new path at T = 1k, 2k, 4k, 8k; dense reference at 1k and 2k only (it needs ~8.6 GB at 3k).
   ``RATIO ttt_memory_linear <8 * mem(1k) / mem(8k)>`` (1.0 = linear; goal >= 0.8 with 8k under 16 GiB).
2. Llama-3.1-8B's drafter shape (MLP 14336, draft vocabulary 32000) at T = 2k, dense vs new:
   ``RATIO ttt_memory_8b <dense / new>`` (goal >= 1.5).
3. Step time (forward + backward) at T = 512 in the 8B shape: both paths in one process, alternated, fastest of
   ``--repeats`` (noise on a shared machine only adds time): ``RATIO ttt_speed_512 <dense / new>`` (goal >= 0.9).
``--allocator-check`` adds the trainer's allocator setting vs glibc's default at long T (memory) and T = 512
(time), for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHAPES = {
    # hidden, heads, kv heads, head dim, MLP, draft vocabulary
    "attn": dict(hidden=4096, heads=32, kv=8, head_dim=128, mlp=1024, vocab=4096),
    "8b": dict(hidden=4096, heads=32, kv=8, head_dim=128, mlp=14336, vocab=32000),
    # Kimi-K2.5's drafter layer (docs/mla.md) with a narrow MLP and vocabulary, like "attn"
    "kimi": dict(hidden=7168, heads=64, kv=64, head_dim=128, mlp=1024, vocab=4096),
}
K = int(os.environ.get("BENCH_DRAFTSMITH_TTT_K", "3"))  # TTT depth (--k sets it for the children too)


def _rss_mb() -> float:
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _hwm_mb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def _setup(shape: str, T: int, seed: int = 0):
    import torch
    from draftsmith.drafter.config import DraftConfig
    from draftsmith.drafter.families.eagle3.model import Eagle3Drafter

    s = SHAPES[shape]
    H, N = s["hidden"], s["vocab"]
    cfg = DraftConfig(
        hidden_size=H, intermediate_size=s["mlp"], num_attention_heads=s["heads"], num_key_value_heads=s["kv"],
        head_dim=s["head_dim"], rms_norm_eps=1e-5, max_position_embeddings=131072, vocab_size=2 * N,
        draft_vocab_size=N, rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, target_hidden_size=H,
        target_num_layers=32, layer_ids=[1, 15, 28],
    )
    torch.manual_seed(seed)
    model = Eagle3Drafter(cfg)
    with torch.no_grad():
        model.d2t.copy_(torch.arange(N))  # draft i -> target 2i
        model.t2d[torch.arange(N) * 2] = True
    B = 1
    batch = dict(
        ids=torch.randint(0, 2 * N, (B, T)), mask=torch.ones(B, T, dtype=torch.bool),
        aux=torch.randn(B, T, 3 * H), final=torch.randn(B, T, H), lengths=torch.full((B,), T),
        in_vocab=torch.ones(B, T, dtype=torch.bool), rows=torch.randn(N, H) * 0.02,
    )
    return model, batch


def _step(model, batch, impl: str) -> float:
    """One forward + backward; returns the loss."""
    from draftsmith.drafter.ttt import target_view, ttt_loss
    from draftsmith.drafter.ttt_attention import set_ttt_attention

    set_ttt_attention(model, "blockwise" if impl == "new" else "dense")
    view = target_view(batch["final"], batch["rows"], model.d2t, model.t2d, in_vocab=batch["in_vocab"],
                       rows=batch["rows"])
    loss, _ = ttt_loss(model, batch["ids"], batch["mask"], batch["aux"], batch["lengths"], view, K,
                       loss="chunked" if impl == "new" else "dense")
    loss.backward()
    return float(loss.detach())


def child_memory(shape: str, T: int, impl: str, allocator: str) -> dict:
    import gc

    import torch

    if allocator == "keep":
        from draftsmith.allocator import keep_freed_memory

        keep_freed_memory()
    model, batch = _setup(shape, T)
    gc.collect()
    before = _rss_mb()
    exact = _reset_peak()
    maxrss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    loss = _step(model, batch, impl)
    dt = time.perf_counter() - t0
    if exact:
        peak = _hwm_mb()
    else:
        peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, maxrss0)
    model_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    return dict(shape=shape, T=T, impl=impl, allocator=allocator, peak_above_mb=peak - before, before_mb=before,
                model_mb=model_mb, step_s=dt, loss=loss, method="VmHWM" if exact else "ru_maxrss",
                threads=torch.get_num_threads())


def child_speed(shape: str, T: int, repeats: int, allocator: str) -> dict:
    import torch

    if allocator == "keep":
        from draftsmith.allocator import keep_freed_memory

        keep_freed_memory()
    model, batch = _setup(shape, T)
    times: dict[str, list[float]] = {"dense": [], "new": []}
    for r in range(repeats + 1):  # round 0 warms both up
        for impl in (("dense", "new") if r % 2 else ("new", "dense")):  # alternated: drift hits both alike
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            _step(model, batch, impl)
            if r:
                times[impl].append(time.perf_counter() - t0)
    return dict(shape=shape, T=T, allocator=allocator, dense_s=min(times["dense"]), new_s=min(times["new"]),
                dense_median=statistics.median(times["dense"]), new_median=statistics.median(times["new"]),
                dense_all=times["dense"], new_all=times["new"], threads=torch.get_num_threads())


def _available_mb() -> float:
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("inf")


def _need_mb(shape: str, T: int, impl: str, allocator: str = "keep") -> float:
    """An estimate of a child's whole footprint (model and inputs, the step) with a 10 % margin, from the figures
    measured on this machine (docs/benchmarks.md, "TTT memory")."""
    base = {"attn": 1500, "8b": 4100, "kimi": 3200}[shape]  # resident before the step
    per_token = {"attn": 1.25, "8b": 1.45, "kimi": 2.2}[shape] * (1.0 if allocator == "keep" else 0.7)
    quad = 1.4e-3 * T * T * (2 if shape == "kimi" else 1) if impl == "dense" else 0.0
    return 1.1 * (base + 700 + per_token * T + quad)


def _wait_for_memory(need: float, wait_s: float) -> bool:
    """Wait (up to ``wait_s``) until the machine has ``need`` MiB available: it is shared, so a large point runs
    only when it cannot push anyone else's process out."""
    deadline = time.monotonic() + wait_s
    while _available_mb() < need:
        if time.monotonic() > deadline:
            return False
        time.sleep(15)
    return True


def _spawn(args: list[str]) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / "shared") + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"child {args} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def _mem(shape: str, T: int, impl: str, allocator: str, wait_s: float = 1800) -> float:
    need = _need_mb(shape, T, impl, allocator)
    if not _wait_for_memory(need, wait_s):
        raise SystemExit(f"{shape} T={T} {impl}: needs ~{need / 1024:.1f} GiB, only {_available_mb() / 1024:.1f} "
                         f"GiB available after {wait_s:.0f} s; run it again on a quieter machine")
    r = _spawn(["memory", shape, str(T), impl, allocator])
    print(f"  {shape:4s} T={T:5d} {impl:5s} allocator={allocator:7s} peak above model {r['peak_above_mb']:9.1f} MiB"
          f"  (model {r['model_mb']:.0f} MiB, step {r['step_s']:.1f} s, {r['method']})", flush=True)
    return r["peak_above_mb"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small T (smoke run): 128..1024, 8B point at 512, speed at 128")
    ap.add_argument("--only", choices=["linear", "8b", "speed", "kimi"], action="append",
                    help="run only these parts (kimi: the Kimi-K2.5 drafter layer's slope, not in the default set)")
    ap.add_argument("--k", type=int, default=K, help="TTT depth (default 3)")
    ap.add_argument("--repeats", type=int, default=5, help="timed steps per path for the speed point")
    ap.add_argument("--speed-shape", choices=sorted(SHAPES), default="8b", help="drafter shape of the speed point")
    ap.add_argument("--allocator", choices=["keep", "default"], default="default",
                    help="default = glibc's own (the trainer's above 2,048 tokens per micro-batch), keep = "
                    "draftsmith.allocator.keep_freed_memory (the trainer's up to 2,048)")
    ap.add_argument("--allocator-check", action="store_true",
                    help="also compare the allocator settings (new path, attention shape at the longest T, and speed)")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        kind, *rest = a.child
        if kind == "memory":
            r = child_memory(rest[0], int(rest[1]), rest[2], rest[3])
        else:
            r = child_speed(rest[0], int(rest[1]), int(rest[2]), rest[3])
        print("RESULT " + json.dumps(r), flush=True)
        return
    os.environ["BENCH_DRAFTSMITH_TTT_K"] = str(a.k)  # the children's depth
    parts = a.only or ["linear", "8b", "speed"]
    lengths = [128, 256, 512, 1024] if a.quick else [1024, 2048, 4096, 8192]
    dense_max = lengths[1]  # never the dense reference above 2k (RAM)
    t8b, tspeed = (512, 128) if a.quick else (2048, 512)
    sfx = "_quick" if a.quick else ""
    ratios = []
    print(f"ttt_memory: k={a.k}, batch 1, float32, {os.cpu_count()} CPUs, allocator={a.allocator}", flush=True)
    if "linear" in parts:
        print("(1) attention-dominated shape (hidden 4096, 32/8 heads, MLP 1024, vocabulary 4096)", flush=True)
        new = {T: _mem("attn", T, "new", a.allocator) for T in lengths}
        for T in lengths:
            if T <= dense_max:
                _mem("attn", T, "dense", a.allocator)
        (t1, m1), (tn, mn) = (lengths[0], new[lengths[0]]), (lengths[-1], new[lengths[-1]])
        slope = (mn - m1) / (tn - t1)
        print(f"  new path: {slope:.3f} MiB/token between T={t1} and T={tn}, "
              f"intercept {m1 - slope * t1:.0f} MiB", flush=True)
        ratios.append(f"RATIO ttt_memory_linear{sfx} {tn / t1 * m1 / mn:.3f}")
        if a.allocator_check:
            other = "default" if a.allocator == "keep" else "keep"
            _mem("attn", tn, "new", other)
            _mem("attn", lengths[1], "new", other)
    if "8b" in parts:
        print(f"(2) Llama-3.1-8B drafter shape (MLP 14336, vocabulary 32000) at T={t8b}", flush=True)
        dense = _mem("8b", t8b, "dense", a.allocator)
        new = _mem("8b", t8b, "new", a.allocator)
        half = _mem("8b", t8b // 2, "new", a.allocator)
        print(f"  new path: {(new - half) / (t8b - t8b // 2):.3f} MiB/token between T={t8b // 2} and T={t8b}",
              flush=True)
        ratios.append(f"RATIO ttt_memory_8b{sfx} {dense / new:.3f}")
    if "kimi" in parts:
        t1, t2 = lengths[0], lengths[1]
        print("(4) Kimi-K2.5 drafter layer (hidden 7168, 64/64 heads, MLP 1024, vocabulary 4096), new path", flush=True)
        m1, m2 = _mem("kimi", t1, "new", a.allocator), _mem("kimi", t2, "new", a.allocator)
        print(f"  new path: {(m2 - m1) / (t2 - t1):.3f} MiB/token between T={t1} and T={t2}", flush=True)
    if "speed" in parts:
        allocs = [a.allocator] + (["default" if a.allocator == "keep" else "keep"] if a.allocator_check else [])
        for alloc in allocs:
            _wait_for_memory(_need_mb(a.speed_shape, tspeed, "dense") + 4096, 1800)
            r = _spawn(["speed", a.speed_shape, str(tspeed), str(a.repeats), alloc])
            print(f"(3) step time, {a.speed_shape} shape, T={tspeed}, allocator={alloc}: dense {r['dense_s']:.2f} s, "
                  f"new {r['new_s']:.2f} s (fastest of {a.repeats}; medians {r['dense_median']:.2f} / "
                  f"{r['new_median']:.2f}; dense {[round(x, 2) for x in r['dense_all']]}, "
                  f"new {[round(x, 2) for x in r['new_all']]})", flush=True)
            if alloc == a.allocator:
                ratios.append(f"RATIO ttt_speed_{tspeed} {r['dense_s'] / r['new_s']:.3f}")
    for line in ratios:
        print(line)


if __name__ == "__main__":
    main()
