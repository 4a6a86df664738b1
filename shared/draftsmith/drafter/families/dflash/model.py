"""The DFlash draft model: a plain ``nn.Module`` (architecture only; the objective and export live beside it).

Source: Chen, Liang and Liu, 2026, "DFlash: Block Diffusion for Flash Speculative Decoding" (arXiv 2602.06036),
and vLLM 0.32's serving implementation ``vllm/model_executor/models/qwen3_dflash.py`` with its proposer
``vllm/v1/spec_decode/dflash.py``, which this module mirrors weight for weight and op for op so that the trained
weights mean the same thing when served:

- Context: the target's hidden states at ``layer_ids`` (outputs of decoder layers, concatenated ``[T, n*H_t]``) go
  through ``fc`` (``[n*H_t] -> [H]``, vLLM's ``combine_hidden_states``) and ``hidden_norm``; every draft layer projects
  this one normed context with its OWN ``k_proj``/``v_proj``, ``k_norm`` and RoPE at the context positions
  (``precompute_and_store_context_kv``: the context is never a query, only keys and values).
- Block: ``[x_a, MASK, ..., MASK]`` at positions ``a .. a + K``: the anchor token (vLLM's bonus token, the target's
  last sampled one) then ``K`` copies of ``mask_token_id``, embedded with the target's (frozen, shared) embedding.
- Each layer is a Qwen3 decoder layer (pre-norm; per-head ``q_norm``/``k_norm`` before RoPE; SwiGLU MLP) whose
  queries attend to the context keys of positions ``< a`` plus every key of their own block, in both directions
  (vLLM builds the draft attention non-causal unless ``dflash_config.causal``; this drafter writes no such key).
- The final ``norm`` then ``lm_head`` over the draft vocabulary give the logits (vLLM maps them to target ids with
  ``d2t``); the output at block slot ``i >= 1`` (position ``a + i``) is the draft of token ``x[a + i]``; the anchor
  slot's output is never sampled (``token_indices_to_sample`` skips it).

Parameter names are vLLM's checkpoint names (``fc``, ``hidden_norm``, ``layers.i.self_attn.{q,k,v,o}_proj``,
``q_norm``, ``k_norm``, ``mlp.{gate,up,down}_proj``, ``input_layernorm``, ``post_attention_layernorm``, ``norm``), so
the state dict minus ``embed_tokens`` (and the rotary tables) is the export.

On vLLM's CPU build a drafter of more than one layer is served differently from this module: the grouped RMSNorm of
the context keys (``_normalize_context_k``, ``ops.rms_norm`` with a ``[L, head_dim]`` weight) applies layer 0's
``k_norm`` weight to every layer's context keys there (``tests/drafter/test_dflash.py`` shows it), so a
multi-layer drafter is exact only where that kernel takes one weight row per layer.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, repeat_kv

from draftsmith.drafter.config import DraftConfig
from draftsmith.errors import ModelError


def default_mask_token_id(target_config: dict[str, Any]) -> int:
    """The id fed to masked slots: the target's ``unk_token_id`` (a row chat text never uses), else its last id.

    Only its embedding row matters (the target's, frozen and shared), and the drafter learns to read it."""
    text = target_config.get("text_config", target_config)
    unk = text.get("unk_token_id", target_config.get("unk_token_id"))
    return int(unk) if unk is not None else int(text["vocab_size"]) - 1


def check_shape(cfg: DraftConfig, block_size: int, mask_token_id: int) -> None:
    """Refuse what vLLM's ``qwen3_dflash.py`` would serve differently from this module.

    Raises:
        ModelError: ``block_size < 2``, a mask id outside the vocabulary, an MLP with biases (vLLM's ``Qwen2MLP``
            has none) or one of EAGLE-3's norm flags (DFlash has no such options).
    """
    if block_size < 2:
        raise ModelError(
            f"DFlash block size {block_size} leaves no masked slot", "draft at least one token per block"
        )
    if not 0 <= mask_token_id < cfg.vocab_size:
        raise ModelError(
            f"mask token id {mask_token_id} is outside the target vocabulary 0..{cfg.vocab_size - 1}"
        )
    if cfg.mlp_bias:
        raise ModelError(
            "the target's MLP has biases; vLLM's DFlash drafter (Qwen2MLP) has none",
            "train this target with train.family=eagle3",
        )
    flags = [
        f for f in ("norm_before_residual", "fc_norm", "norm_before_fc", "norm_output") if getattr(cfg, f)
    ]
    if flags:
        raise ModelError(f"{flags} are EAGLE-3 options; a DFlash drafter has none", f"unset train.{flags[0]}")


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style RoPE (vLLM's ``is_neox_style=True``): ``x`` ``[B, h, T, d]``, ``cos``/``sin`` ``[B, T, d]``."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [B, 1, T, d]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)  # [B, h, T, d]
    return x * cos + rotated * sin


class DFlashAttention(nn.Module):
    """vLLM's ``DFlashQwen3Attention``: Qwen3 attention whose keys/values are the context's then the block's."""

    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.h, self.h_kv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        H, bias = cfg.hidden_size, cfg.attention_bias  # vLLM: q/k/v and o_proj biases together
        self.q_proj = nn.Linear(H, self.h * self.d, bias=bias)
        self.k_proj = nn.Linear(H, self.h_kv * self.d, bias=bias)
        self.v_proj = nn.Linear(H, self.h_kv * self.d, bias=bias)
        self.o_proj = nn.Linear(self.h * self.d, H, bias=bias)
        self.q_norm = LlamaRMSNorm(self.d, eps=cfg.rms_norm_eps)  # per head, before RoPE
        self.k_norm = LlamaRMSNorm(self.d, eps=cfg.rms_norm_eps)

    def _kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` ``[B, T, H]`` -> rotated, normed keys and values, each ``[B, h_kv, T, d]``."""
        B, T, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(B, T, self.h_kv, self.d)).transpose(1, 2)  # [B, h_kv, T, d]
        v = self.v_proj(x).view(B, T, self.h_kv, self.d).transpose(1, 2)  # [B, h_kv, T, d]
        return rotate(k, cos, sin), v

    def forward(
        self,
        x: torch.Tensor,
        rope_q: tuple[torch.Tensor, torch.Tensor],
        context: torch.Tensor,
        rope_c: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """Attend the block's queries to ``[context keys | block keys]``.

        Args:
            x: ``[B, Q, H]`` normed block states (Q = blocks x block size, all blocks of a row side by side).
            rope_q: ``(cos, sin)`` ``[B, Q, d]`` at the block positions.
            context: ``[B, T, H]`` ``hidden_norm(fc(aux))``, the same for every layer.
            rope_c: ``(cos, sin)`` ``[B, T, d]`` at the context positions.
            mask: ``[B, 1, Q, T + Q]`` bool, True where a query may attend.

        Returns:
            ``[B, Q, H]``.
        """
        B, Q, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, Q, self.h, self.d)).transpose(1, 2)  # [B, h, Q, d]
        q = rotate(q, *rope_q)
        k_b, v_b = self._kv(x, *rope_q)  # [B, h_kv, Q, d] each: the block's own keys
        k_c, v_c = self._kv(context, *rope_c)  # [B, h_kv, T, d] each: the injected context
        rep = self.h // self.h_kv
        k = repeat_kv(torch.cat([k_c, k_b], dim=2), rep)  # [B, h, T + Q, d]
        v = repeat_kv(torch.cat([v_c, v_b], dim=2), rep)  # [B, h, T + Q, d]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, h, Q, d], scale d**-0.5
        return self.o_proj(out.transpose(1, 2).reshape(B, Q, self.h * self.d))


class DFlashDecoderLayer(nn.Module):
    """vLLM's ``DFlashQwen3DecoderLayer``: pre-norm attention then SwiGLU MLP, each added to the residual."""

    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.self_attn = DFlashAttention(cfg)
        self.post_attention_layernorm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg.llama_config())  # gate_proj, up_proj, down_proj: vLLM's Qwen2MLP

    def forward(
        self, x: torch.Tensor, rope_q, context: torch.Tensor, rope_c, mask: torch.Tensor
    ) -> torch.Tensor:
        """``x`` ``[B, Q, H]`` residual stream in, out (see :meth:`DFlashAttention.forward` for the rest)."""
        x = x + self.self_attn(self.input_layernorm(x), rope_q, context, rope_c, mask)  # [B, Q, H]
        return x + self.mlp(self.post_attention_layernorm(x))  # [B, Q, H]


class DFlashDrafter(nn.Module):
    """DFlash drafter of ``cfg`` (the target's widths; ``cfg.num_layers`` decoder layers; see the module docstring).

    ``embed_tokens`` ``[V, H]`` is the target's, frozen and not exported (vLLM shares it). The head ``lm_head``
    ``[N, H]`` covers the run's draft vocabulary (buffers ``d2t`` ``[N]``: target id = ``i + d2t[i]``, ``t2d``
    ``[V]`` bool), as EAGLE-3's does; vLLM's DFlash model reads the same ``d2t`` (``draft_id_to_target_id``) and
    scatters the logits into the target vocabulary. With ``N = V`` it is the target's whole vocabulary.

    Args:
        cfg: shape copied from the target (:func:`draftsmith.drafter.config.derive_config`).
        block_size: slots per block S (the anchor + S - 1 masks; vLLM serves K <= S - 1 of them).
        mask_token_id: target-vocabulary id fed to the masked slots.

    Raises:
        ModelError: see :func:`check_shape`.
    """

    def __init__(self, cfg: DraftConfig, block_size: int, mask_token_id: int) -> None:
        super().__init__()
        check_shape(cfg, block_size, mask_token_id)
        self.cfg, self.block_size, self.mask_token_id = cfg, int(block_size), int(mask_token_id)
        H, N = cfg.hidden_size, cfg.draft_vocab_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, H)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(len(cfg.layer_ids) * cfg.target_hidden_size, H, bias=False)
        self.hidden_norm = LlamaRMSNorm(H, eps=cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashDecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = LlamaRMSNorm(H, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(H, N, bias=False)
        self.rotary = LlamaRotaryEmbedding(cfg.llama_config())
        self.register_buffer("d2t", torch.zeros(N, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))

    def context(self, aux: torch.Tensor) -> torch.Tensor:
        """``[B, T, n*H_t]`` target hidden states at ``layer_ids`` -> ``[B, T, H]`` normed context (``fc`` then
        ``hidden_norm``, as vLLM's ``combine_hidden_states`` then ``_project_context_kv``)."""
        return self.hidden_norm(self.fc(aux.to(self.fc.weight.dtype)))

    def forward(
        self,
        block_ids: torch.Tensor,
        block_pos: torch.Tensor,
        aux: torch.Tensor,
        context_pos: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """Denoise every block of a batch in one pass.

        Args:
            block_ids: ``[B, Q]`` target-vocabulary ids (each block: anchor token, then ``mask_token_id``).
            block_pos: ``[B, Q]`` positions of the block slots (anchor ``a`` .. ``a + block_size - 1``).
            aux: ``[B, T, n*H_t]`` target hidden states of the context.
            context_pos: ``[B, T]`` positions of the context rows.
            mask: ``[B, 1, Q, T + Q]`` bool attention mask (True = attend), keys ordered ``[context | blocks]``.

        Returns:
            ``[B, Q, H]`` final-normed states; :meth:`logits` reads them.
        """
        context = self.context(aux)  # [B, T, H]
        x = self.embed_tokens(block_ids).to(context.dtype)  # [B, Q, H]
        rope_q = self.rotary(x, block_pos)  # (cos, sin) [B, Q, d]
        rope_c = self.rotary(context, context_pos)  # (cos, sin) [B, T, d]
        for layer in self.layers:
            x = layer(x, rope_q, context, rope_c, mask)  # [B, Q, H]
        return self.norm(x)

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """``[..., H]`` -> draft-vocabulary logits ``[..., N]``."""
        return self.lm_head(normed)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids (``i + d2t[i]``)."""
        return draft_ids + self.d2t[draft_ids]

    def trainable_parameters(self) -> list[nn.Parameter]:
        """Every parameter but the frozen target embedding."""
        return [p for p in self.parameters() if p.requires_grad]
