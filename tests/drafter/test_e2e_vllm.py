"""End to end in a real engine: train on real SmolLM2 features, export both layouts, serve each in vLLM's CPU build
with ``--speculative-config {"method": "eagle3", ...}`` and check that tokens are accepted on held-out prompts.

A randomly initialised drafter gets exactly 0 accepted tokens here (``../shared/notes/embedded-target.md``); a
wrong layer-id mapping, norm flag or weight layout also lands at (or near) zero.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest
import torch
from draftsmith.drafter.checkpoint import list_checkpoints
from draftsmith.drafter.families.eagle3.export import export_checkpoint

HELD_OUT = [  # not in the training fixture (GSM8K train + self-instruct seeds)
    "What is the capital of France?",
    "Give three tips for staying healthy.",
    "If a train travels 60 miles in 1.5 hours, what is its average speed?",
    "Explain what a noun is in one sentence.",
]


def spec_counters(metrics_text: str) -> dict[str, float]:
    """``vllm:spec_decode_*_total`` counters (per-position ones keyed ``..._per_pos_total[p]``)."""
    out: dict[str, float] = {}
    for line in metrics_text.splitlines():
        if not line.startswith("vllm:spec_decode_") or "_created" in line:
            continue
        name, value = line.rsplit(" ", 1)
        key = name.split("{")[0]
        if "position=" in name:
            key += "[" + name.split('position="')[1].split('"')[0] + "]"
        out[key] = out.get(key, 0.0) + float(value)
    return out


@pytest.mark.e2e
@pytest.mark.slow
def test_trained_drafter_is_accepted_in_vllm(reference_run, embedded_target, draft_vocab, tmp_path):
    from draftsmith.config import load_settings
    from draftsmith.drafter.offline import estimate_acceptance
    from draftsmith.drafter.trainer import Trainer
    from draftsmith.target.server import VLLMServer, VLLMServerSpec, free_port

    runs = tmp_path / "runs"
    shutil.copytree(reference_run, runs / "e2e")
    s = load_settings(None, {"runs_dir": str(runs), "run": "e2e", "target": {"path": str(embedded_target)},
                             "train": {"draft_vocab_size": draft_vocab, "ttt_steps": 3, "max_steps": 48,
                                       "batch_size": 4, "batch_tokens": 640, "lr": 2e-3, "warmup_ratio": 0.05,
                                       "log_every": 8, "eval_every": 1000}})
    result = Trainer(s).run()
    assert result["heldout"]["acc"][0] > 0.1, result
    ckpt = list_checkpoints(runs / "e2e" / "checkpoints")[-1]
    outs = export_checkpoint(ckpt, str(embedded_target), runs / "e2e" / "export", "both")
    prompts = [[{"role": "user", "content": q}] for q in HELD_OUT]
    for out in outs:
        spec = VLLMServerSpec(model=Path(embedded_target), served_name="smol", port=free_port(), max_model_len=1024,
                              kv_cache_gib=1, enforce_eager=True, max_num_seqs=4,
                              speculative={"method": "eagle3", "model": str(out), "num_speculative_tokens": 3})
        with VLLMServer(spec, tmp_path / f"vllm-{out.name}.log").start(timeout_s=900) as server:
            for p in prompts:
                r = httpx.post(f"{server.url}/v1/chat/completions", timeout=600, json={
                    "model": "smol", "messages": p, "max_tokens": 48, "temperature": 0.0})
                r.raise_for_status()
            c = spec_counters(httpx.get(f"{server.url}/metrics", timeout=30).text)
        drafts = c["vllm:spec_decode_num_drafts_total"]
        accepted = c["vllm:spec_decode_num_accepted_tokens_total"]
        assert c["vllm:spec_decode_num_draft_tokens_total"] == 3 * drafts > 0
        assert accepted > 0, (out.name, c)
        offline = estimate_acceptance(embedded_target, out, prompts[:2], k=3, max_new_tokens=24)
        print(json.dumps({"layout": out.name, "vllm_mean_acceptance_length": 1 + accepted / drafts,
                          "vllm_acceptance_rate": accepted / (3 * drafts),
                          "offline": {k: offline[k] for k in ("mean_acceptance_length", "acceptance_rate")}}))
        assert offline["accepted"] > 0



@pytest.mark.e2e
@pytest.mark.slow
def test_vllm_serves_eagle31_norms_as_trained(embedded_target, tmp_path):
    """A drafter with EAGLE-3.1's ``norm_before_fc`` and ``norm_output`` (random weights, a non-unit
    ``input_norm.weight``), served from draftsmith's eagle3 export in vLLM (float32, the offline chain's dtype):
    vLLM loads it (an unexpected weight name fails its loader) and its greedy output and drafting counters equal
    our own greedy chain's (``draftsmith.drafter.offline``) token for token. A random drafter is never accepted,
    so this proves loading and agreement, not that vLLM applies the two norms: that is read from vLLM's own
    config readers and weight names in tests/drafter/test_eagle31.py."""
    from draftsmith.drafter.config import derive_config
    from draftsmith.drafter.families.eagle3.export import write_export
    from draftsmith.drafter.families.eagle3.model import Eagle3Drafter
    from draftsmith.drafter.load import load_export_model
    from draftsmith.drafter.offline import estimate_acceptance
    from draftsmith.target.server import VLLMServer, VLLMServerSpec, free_port

    torch.manual_seed(0)
    m = Eagle3Drafter(derive_config(embedded_target, 64, norm_before_fc=True, norm_output=True))
    with torch.no_grad():
        m.input_norm.weight.uniform_(0.5, 1.5)
        m.d2t.copy_(torch.arange(64) * 2)  # draft i -> target 3 * i
        m.t2d[torch.arange(64) * 3] = True
    out = write_export(m, tmp_path / "eagle3", "eagle3")
    back = load_export_model(out, embedded_target)
    assert back.cfg.norm_before_fc and back.cfg.norm_output
    torch.testing.assert_close(back.input_norm.weight, m.input_norm.weight)
    k, n_new = 3, 24
    prompts = [[{"role": "user", "content": q}] for q in HELD_OUT[1:3]]  # answers longer than n_new tokens
    ours = estimate_acceptance(embedded_target, out, prompts, k=k, max_new_tokens=n_new)
    spec = VLLMServerSpec(model=Path(embedded_target), served_name="smol", port=free_port(), max_model_len=1024,
                          kv_cache_gib=1, enforce_eager=True, max_num_seqs=1, dtype="float32",
                          speculative={"method": "eagle3", "model": str(out), "num_speculative_tokens": k})
    served = []
    with VLLMServer(spec, tmp_path / "vllm-e31.log").start(timeout_s=900) as server:
        for p in prompts:
            r = httpx.post(f"{server.url}/v1/chat/completions", timeout=600, json={
                "model": "smol", "messages": p, "max_tokens": n_new, "temperature": 0.0, "return_token_ids": True})
            r.raise_for_status()
            served.append(r.json()["choices"][0]["token_ids"])
        c = spec_counters(httpx.get(f"{server.url}/metrics", timeout=30).text)
    vllm = (c["vllm:spec_decode_num_drafts_total"], c["vllm:spec_decode_num_accepted_tokens_total"],
            [c[f"vllm:spec_decode_num_accepted_tokens_per_pos_total[{p}]"] for p in range(k)])
    print(json.dumps({"vllm": vllm, "ours": [ours[x] for x in ("drafts", "accepted", "accepted_per_position")]}))
    assert served == [g[:n_new] for g in ours["generated_ids"]] and all(len(g) == n_new for g in served)
    assert vllm == (ours["drafts"], ours["accepted"], ours["accepted_per_position"])
    assert ours["drafts"] == 2 * (n_new - 1)  # nothing accepted: one round per generated token after the first
