"""The EAGLE-3 draft model: a plain ``nn.Module`` (architecture only; training, export and parallelism live elsewhere).

Source: Li et al., 2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language Models via Training-Time
Test", and vLLM's serving implementation ``vllm/model_executor/models/llama_eagle3.py``, which this module mirrors
weight for weight so that training matches serving:

- ``fc`` fuses the target's aux features ``[T, 3*H_t] -> [T, H]`` (step 0 only). ``norm_before_fc`` (EAGLE-3.1,
  vLLM's ``input_norm``) first puts the whole concatenation through one RMSNorm over ``3*H_t``; ``fc_norm`` gives
  each of the three features its own RMSNorm (vLLM's ``fc_norm`` option), which evens out aux layers whose scales
  differ several-fold. vLLM applies them in that order (``llama_eagle3.combine_hidden_states``).
- layer 0 takes ``cat(input_layernorm(embed(token)), hidden_norm(feature))`` (2H wide) into q/k/v; the residual
  stream carries the feature (or the normed feature when ``norm_before_residual``); then o_proj, fused add +
  post-attention norm, SwiGLU MLP. Later layers (if any) are plain Llama layers (H wide, fused add-norm).
- The final norm returns the normed state (to ``lm_head``, over the draft vocabulary) and the hidden state fed back
  at the next draft step (vLLM's ``aux_output``): the pre-norm sum ``residual + mlp_out``, or with ``norm_output``
  (EAGLE-3.1) the normed state itself, which keeps its scale from drifting over the steps of a chain.
- Step ``j`` of a chain reads token ``x[t+j+1]`` at position ``t + j`` and attends to the step-0 keys of
  positions ``0..t`` plus its own row's keys from steps ``1..j`` (the training-time-test pattern, which is exactly
  what vLLM's KV cache holds while it drafts).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
    repeat_kv,
)

from draftsmith.drafter.config import DraftConfig
from draftsmith.drafter.ttt_attention import ATTENTION

# One layer's keys/values per draft step: cache[step] = (k, v), each [B, h_kv, T, d] (rotated keys).
LayerCache = list[tuple[torch.Tensor, torch.Tensor]]


class DraftAttention(nn.Module):
    """Grouped-query self-attention with the training-time-test key layout (see module docstring)."""

    ttt_attention = "blockwise"  # steps >= 1: "blockwise" or "dense" (drafter/ttt_attention.set_ttt_attention)

    def __init__(self, cfg: DraftConfig, in_features: int) -> None:
        super().__init__()
        self.h, self.h_kv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(in_features, self.h * self.d, bias=bias)
        self.k_proj = nn.Linear(in_features, self.h_kv * self.d, bias=bias)
        self.v_proj = nn.Linear(in_features, self.h_kv * self.d, bias=bias)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: LayerCache) -> torch.Tensor:
        """Attend for one draft step and append this step's keys/values to ``cache``.

        Args:
            x: ``[B, T, in_features]`` layer input (row t = draft position t + step).
            cos, sin: ``[B, T, d]`` rotary tables for this step's positions.
            cache: keys/values of earlier steps of this layer; empty at step 0.

        Returns:
            ``[B, T, H]``.
        """
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.h, self.d).transpose(1, 2)  # [B, h, T, d]
        k = self.k_proj(x).view(B, T, self.h_kv, self.d).transpose(1, 2)  # [B, h_kv, T, d]
        v = self.v_proj(x).view(B, T, self.h_kv, self.d).transpose(1, 2)  # [B, h_kv, T, d]
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        cache.append((k, v))
        if len(cache) == 1:
            rep = self.h // self.h_kv
            k0, v0 = repeat_kv(cache[0][0], rep), repeat_kv(cache[0][1], rep)  # [B, h, T, d]
            out = F.scaled_dot_product_attention(q, k0, v0, is_causal=True)  # [B, h, T, d]
        else:  # causal block over the step-0 keys + this row's keys of steps 1..j (drafter/ttt_attention.py)
            out = ATTENTION[self.ttt_attention](q, cache)  # [B, h, T, d]
        out = out.transpose(1, 2).reshape(B, T, self.h * self.d)  # [B, T, h*d]
        return self.o_proj(out)


class DraftDecoderLayer(nn.Module):
    """One EAGLE-3 decoder layer (vLLM ``llama_eagle3.LlamaDecoderLayer``); layer 0 is 2H wide at q/k/v."""

    def __init__(self, cfg: DraftConfig, layer_idx: int) -> None:
        super().__init__()
        H = cfg.hidden_size
        self.layer_idx = layer_idx
        self.norm_before_residual = cfg.norm_before_residual
        self.input_layernorm = LlamaRMSNorm(H, eps=cfg.rms_norm_eps)
        if layer_idx == 0:
            self.hidden_norm = LlamaRMSNorm(H, eps=cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg, 2 * H if layer_idx == 0 else H)
        self.post_attention_layernorm = LlamaRMSNorm(H, eps=cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg.llama_config())

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: LayerCache,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``embeds``, ``hidden``: ``[B, T, H]``; returns ``(mlp_out, residual)``, each ``[B, T, H]``."""
        if self.layer_idx == 0:
            e = self.input_layernorm(embeds)  # [B, T, H]
            if self.norm_before_residual:
                hidden = self.hidden_norm(hidden)
                residual = hidden
            else:
                residual = hidden
                hidden = self.hidden_norm(hidden)
            x = torch.cat([e, hidden], dim=-1)  # [B, T, 2H]
        else:
            residual = hidden + residual
            x = self.input_layernorm(residual)  # [B, T, H]
        h = self.self_attn(x, cos, sin, cache)  # [B, T, H]
        residual = h + residual
        h = self.mlp(self.post_attention_layernorm(residual))  # [B, T, H]
        return h, residual


class Eagle3Drafter(nn.Module):
    """EAGLE-3 draft model over a draft vocabulary of ``cfg.draft_vocab_size`` tokens.

    Buffers ``d2t`` ``[N]`` int64 (target id = i + d2t[i]) and ``t2d`` ``[V]`` bool travel with the weights.
    ``embed_tokens`` is the target's embedding, frozen (not exported: vLLM shares the target's).
    """

    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.cfg = cfg
        H, N = cfg.hidden_size, cfg.draft_vocab_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, H)
        self.embed_tokens.weight.requires_grad_(False)
        n_aux = len(cfg.layer_ids)
        # vLLM's name for the norm_before_fc weight (``input_norm.weight``), so exports need no rename
        self.input_norm = (LlamaRMSNorm(n_aux * cfg.target_hidden_size, eps=cfg.rms_norm_eps)
                           if cfg.norm_before_fc else None)
        self.fc_norm = (nn.ModuleList(LlamaRMSNorm(cfg.target_hidden_size, eps=cfg.rms_norm_eps) for _ in range(n_aux))
                        if cfg.fc_norm else None)
        self.fc = nn.Linear(n_aux * cfg.target_hidden_size, H, bias=False)
        self.layers = nn.ModuleList(DraftDecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = LlamaRMSNorm(H, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(H, N, bias=False)
        self.rotary = LlamaRotaryEmbedding(cfg.llama_config())
        self.register_buffer("d2t", torch.zeros(N, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))

    def fuse(self, aux_hidden: torch.Tensor) -> torch.Tensor:
        """``[B, T, 3*H_t]`` target aux features -> ``[B, T, H]`` step-0 hidden input."""
        aux_hidden = aux_hidden.to(self.fc.weight.dtype)
        if self.input_norm is not None:
            aux_hidden = self.input_norm(aux_hidden)  # [B, T, 3*H_t], one RMS over the three features
        if self.fc_norm is not None:
            chunks = aux_hidden.chunk(len(self.fc_norm), dim=-1)  # 3 x [B, T, H_t]
            aux_hidden = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks, strict=True)], dim=-1)
        return self.fc(aux_hidden)

    def step(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        step: int,
        caches: list[LayerCache],
        position_offset: torch.Tensor | int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step over every row of a batch.

        Args:
            input_ids: ``[B, T]`` target-vocabulary ids; row t holds token ``x[t + step + 1]``.
            hidden: ``[B, T, H]``: ``fuse(aux)`` at step 0, the previous step's second output after.
            step: draft step index j (positions are ``t + j + position_offset``).
            caches: one list per layer, filled in place (start with ``[[] for _ in layers]``).
            position_offset: added to every position (0 for whole sequences).

        Returns:
            ``(normed [B, T, H], next_hidden [B, T, H])``; logits come from :meth:`logits` on ``normed``;
            ``next_hidden`` is the pre-norm sum, or ``normed`` itself with ``norm_output``.
        """
        B, T = input_ids.shape
        pos = torch.arange(T, device=input_ids.device).unsqueeze(0).expand(B, T) + step + position_offset  # [B, T]
        embeds = self.embed_tokens(input_ids).to(hidden.dtype)  # [B, T, H]
        cos, sin = self.rotary(hidden, pos)  # [B, T, d]
        residual = None
        for layer, cache in zip(self.layers, caches, strict=True):
            hidden, residual = layer(embeds, hidden, residual, cos, sin, cache)
        prenorm = hidden + residual  # [B, T, H]
        normed = self.norm(prenorm)  # [B, T, H]
        return normed, normed if self.cfg.norm_output else prenorm

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """``[..., H]`` -> draft-vocabulary logits ``[..., N]``."""
        return self.lm_head(normed)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids (``i + d2t[i]``)."""
        return draft_ids + self.d2t[draft_ids]

    def new_caches(self) -> list[LayerCache]:
        """Empty per-layer caches for a new chain."""
        return [[] for _ in self.layers]

    def trainable_parameters(self) -> list[nn.Parameter]:
        """Every parameter but the frozen target embedding."""
        return [p for p in self.parameters() if p.requires_grad]
