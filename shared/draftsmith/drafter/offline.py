"""Offline acceptance estimate: greedy chain speculation of an exported drafter against the target, in transformers.

Same definitions as vLLM's ``vllm:spec_decode_*`` counters (``docs/evaluation.md``): per drafting round the
drafter proposes ``k`` tokens; the target verifies them greedily (temperature 0) and accepts the longest matching
prefix, then adds its own bonus token. ``acceptance_rate = accepted / draft_tokens``, ``mean_acceptance_length =
1 + accepted / drafts`` (1 to k+1, bonus token included), ``per_position[p] = accepted at position p / drafts``.

The drafter sees exactly what vLLM gives it: the prefix's aux features (target KV cache, cropped after each
verification), step 0 on every prefix row with token ``x[t+1]`` (the last row holds the token just sampled), then
``k-1`` chained steps feeding back its own pre-norm hidden state and its own proposals.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from draftsmith.data.render import load_tokenizer
from draftsmith.drafter.hf_features import load_target
from draftsmith.drafter.load import load_export_model
from draftsmith.features.layers import hf_hidden_index
from draftsmith.log import get_logger

log = get_logger(__name__)


def _prompt_ids(tok, messages: list[dict]) -> list[int]:
    out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)


@torch.no_grad()
def propose(drafter, seq: list[int], next_token: int, aux: torch.Tensor, k: int) -> list[int]:
    """``k`` greedy draft tokens (target ids) after ``seq + [next_token]``.

    Args:
        drafter: :class:`~draftsmith.drafter.families.eagle3.model.Eagle3Drafter`. seq: ``n`` token ids with features.
        aux: ``[n, 3*H_t]`` target aux features of ``seq``.
    """
    n = len(seq)
    ids0 = torch.tensor([seq[1:] + [next_token]])  # [1, n] row t holds x[t+1]
    hidden = drafter.fuse(aux.unsqueeze(0))  # [1, n, H]
    caches = drafter.new_caches()
    out: list[int] = []
    ids = ids0
    for j in range(k):
        normed, hidden = drafter.step(ids, hidden, j, caches)  # [1, n, H] each
        d = int(drafter.logits(normed[0, -1]).argmax())
        t = int(drafter.draft_to_target(torch.tensor(d)))
        out.append(t)
        ids = torch.zeros(1, n, dtype=torch.long)
        ids[0, -1] = t  # only the last row is a live chain; other rows are never read by it
    return out


@torch.no_grad()
def estimate_acceptance(
    target_path: str | Path,
    drafter_dir: str | Path,
    prompts: list[list[dict]],
    k: int = 3,
    max_new_tokens: int = 64,
    trust_remote_code: bool = False,
) -> dict[str, Any]:
    """Greedy chain speculation of ``drafter_dir`` (either export layout) against the target.

    Args:
        target_path: target checkpoint folder (tokenizer with chat template, weights).
        drafter_dir: exported drafter folder.
        prompts: chat conversations (``[{"role", "content"}, ...]``), rendered with the tokenizer's template.
        k: speculative tokens per round. max_new_tokens: generated tokens per prompt (at most).
        trust_remote_code: ``target.trust_remote_code`` (tokenizer and model code the checkpoint ships).

    Returns:
        ``{"acceptance_rate", "mean_acceptance_length", "per_position": [k floats], "drafts", "draft_tokens",
        "accepted", "accepted_per_position": [k ints], "generated_tokens", "generated_ids": [one list of target
        ids per prompt], "k", "definitions"}``; a prompt's ids may run up to ``k`` past ``max_new_tokens`` (the
        last round's accepted drafts), where an engine would cut them.

    Raises:
        ModelError: the drafter does not fit the target (see :mod:`draftsmith.drafter.load`).
    """
    from transformers import DynamicCache

    tok = load_tokenizer(target_path, trust_remote_code=trust_remote_code)
    target = load_target(target_path, trust_remote_code=trust_remote_code)
    drafter = load_export_model(drafter_dir, target_path)
    layer_ids = drafter.cfg.layer_ids
    gen_eos = getattr(target.generation_config, "eos_token_id", None)
    eos = {t for t in ([tok.eos_token_id] + (gen_eos if isinstance(gen_eos, list) else [gen_eos])) if t is not None}
    drafts = draft_tokens = accepted = generated_total = 0
    per_pos = [0] * k
    outputs: list[list[int]] = []

    def run(ids: list[int], cache) -> tuple[torch.Tensor, torch.Tensor]:
        o = target(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True, output_hidden_states=True)
        aux = torch.cat([o.hidden_states[hf_hidden_index(i)][0] for i in layer_ids], dim=-1)  # [m, 3H]
        return aux, o.logits[0].argmax(-1)  # [m, 3H], [m]

    for messages in prompts:
        seq = _prompt_ids(tok, messages)
        cache = DynamicCache(config=target.config)
        aux, pred = run(seq, cache)
        g = int(pred[-1])
        generated = [g]
        while len(generated) < max_new_tokens and g not in eos:
            d = propose(drafter, seq, g, aux, k)
            new_aux, pred = run([g] + d, cache)  # pred[i]: target's choice after g, d[0..i-1]
            a = 0
            while a < k and d[a] == int(pred[a]):
                a += 1
            drafts, draft_tokens, accepted = drafts + 1, draft_tokens + k, accepted + a
            for p in range(a):
                per_pos[p] += 1
            seq = seq + [g] + d[:a]
            drop = cache.get_seq_length() - len(seq)  # rejected drafts leave the target's KV cache
            if drop > 0:
                cache.crop(-drop)
            aux = torch.cat([aux, new_aux[: 1 + a]])
            g = int(pred[a])
            generated += d[:a] + [g]
            if any(t in eos for t in d[:a]):
                break
        generated_total += len(generated)
        outputs.append(generated)
    return {
        "acceptance_rate": accepted / max(draft_tokens, 1),
        "mean_acceptance_length": 1 + accepted / max(drafts, 1),
        "per_position": [c / max(drafts, 1) for c in per_pos],
        "drafts": drafts, "draft_tokens": draft_tokens, "accepted": accepted, "accepted_per_position": per_pos,
        "generated_tokens": generated_total, "generated_ids": outputs, "k": k,
        "definitions": "vLLM: rate = accepted/draft_tokens; length = 1 + accepted/drafts; per_position = "
                       "accepted at p / drafts (greedy chain, T=0)",
    }
