"""vLLM's own DFlash drafter on CPU, as the reference of ``test_dflash.py`` (run in a subprocess: it sets up vLLM's
process-wide config and a one-process gloo group, which the test process must not keep).

Usage: ``python dflash_vllm_reference.py TARGET EXPORT INPUTS.pt OUT.pt``. It builds
``vllm.model_executor.models.qwen3_dflash.DFlashQwen3ForCausalLM`` through vLLM's ``SpeculativeConfig`` on the
export (so the registry, ``EAGLEConfig`` and the weight loader are vLLM's), loads the export's weights with its
``load_weights``, runs ``process_weights_after_loading`` as vLLM's loader does, and computes one block exactly as the
proposer does: ``combine_hidden_states`` then ``precompute_and_store_context_kv`` for the context (the K/V it would
write to the cache are captured at the cache-write call), then the model's forward on ``[anchor, masks]`` with its
Attention layers' kernel replaced by plain non-causal attention over ``[context K/V | block K/V]`` (what the CPU
attention backend computes for a non-causal DFlash query), then ``compute_logits``. ``INPUTS.pt`` holds ``aux``
``[T, n*H_t]``, ``ids`` ``[S]`` and ``pos`` ``[S]``; ``OUT.pt`` gets ``logits`` ``[S, V]``, ``hidden`` ``[S, H]``,
the loaded parameter names and the captured context keys per layer.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F


class CaptureKV:
    """Stands in for an Attention layer's backend at the cache write: keeps the context K/V vLLM computed."""

    def __init__(self, store: dict, i: int) -> None:
        self.store, self.i = store, i

    def do_kv_cache_update(self, attn, k, v, kv_cache, slot_mapping) -> None:
        self.store[self.i] = (k.clone(), v.clone())  # [T, h_kv, d] each


class PlainAttention(torch.nn.Module):
    """``attn(q, k, v)`` of one layer: queries ``[Q, h*d]`` over the captured context K/V then the block's own."""

    def __init__(self, store: dict, i: int, h: int, h_kv: int, d: int) -> None:
        super().__init__()
        self.store, self.i, self.h, self.h_kv, self.d = store, i, h, h_kv, d

    def forward(self, q, k, v):
        ck, cv = self.store[self.i]
        Q = q.shape[0]
        keys = torch.cat([ck, k.view(Q, self.h_kv, self.d)]).transpose(0, 1)  # [h_kv, T + Q, d]
        vals = torch.cat([cv, v.view(Q, self.h_kv, self.d)]).transpose(0, 1)
        rep = self.h // self.h_kv
        out = F.scaled_dot_product_attention(
            q.view(Q, self.h, self.d).transpose(0, 1),
            keys.repeat_interleave(rep, 0),
            vals.repeat_interleave(rep, 0),
        )
        return out.transpose(0, 1).reshape(Q, self.h * self.d)


def main(target: str, export: str, inputs: str, out: str) -> None:
    from safetensors.torch import load_file
    from vllm.config import (
        DeviceConfig,
        ModelConfig,
        ParallelConfig,
        SpeculativeConfig,
        VllmConfig,
        set_current_vllm_config,
    )
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.model_loader.utils import process_weights_after_loading
    from vllm.model_executor.models.registry import ModelRegistry

    tc = ModelConfig(model=target, dtype="float32", max_model_len=1024, enforce_eager=True)
    sc = SpeculativeConfig(
        method="dflash",
        model=export,
        num_speculative_tokens=3,
        target_model_config=tc,
        target_parallel_config=ParallelConfig(),
    )
    vc = VllmConfig(model_config=tc, speculative_config=sc, device_config=DeviceConfig("cpu"))
    cls, _ = ModelRegistry.resolve_model_cls(sc.draft_model_config.architectures, sc.draft_model_config)
    with set_current_vllm_config(vc):
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            backend="gloo",
            distributed_init_method=f"file://{Path(out).with_suffix('.dist')}",
        )
        initialize_model_parallel(1, 1)
        vm = cls(vllm_config=vc)
        vm.load_weights(load_file(str(Path(export) / "model.safetensors")).items())
        process_weights_after_loading(vm, sc.draft_model_config, torch.device("cpu"))
        x = torch.load(inputs)
        with torch.no_grad():  # the target's embedding is shared at serve time
            vm.model.embed_tokens.weight.copy_(x["embed"])
        store: dict = {}
        for i, layer in enumerate(vm.model.layers):
            a = layer.self_attn
            a.attn.impl = CaptureKV(store, i)
        aux = x["aux"]
        with torch.no_grad():
            ctx = vm.combine_hidden_states(aux)  # [T, H]
            vm.precompute_and_store_context_kv(
                ctx, torch.arange(aux.shape[0]), torch.zeros(aux.shape[0], dtype=torch.long)
            )
            for i, layer in enumerate(vm.model.layers):
                a = layer.self_attn
                a.attn = PlainAttention(store, i, a.num_heads, a.num_kv_heads, a.head_dim)
            hidden = vm(x["ids"], x["pos"])  # [S, H]
            logits = vm.compute_logits(hidden)  # [S, V]
    torch.save(
        {
            "cls": cls.__name__,
            "hidden": hidden,
            "logits": logits,
            "params": [n for n, _ in vm.named_parameters()],
            "context_k": [store[i][0] for i in sorted(store)],
        },
        out,
    )


if __name__ == "__main__":
    main(*sys.argv[1:5])
