"""Target features computed in-process with transformers (tests, the benchmark, the offline acceptance estimate).

Layer ids: output of decoder layer ``i`` = ``output_hidden_states[i + 1]`` (``draftsmith.features.layers``).
``final_hidden`` is the last decoder output after the final norm, which transformers returns as
``output_hidden_states[-1]`` for Llama-family models (checked: ``hidden_states[-1] @ lm_head.T == logits``).
"""

from __future__ import annotations

import torch

from draftsmith.features.layers import hf_hidden_index


def load_target(target_path, dtype: torch.dtype = torch.float32):
    """The target as a transformers causal LM in eval mode (local folder only)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target_path), dtype=dtype)
    return model.eval()


@torch.no_grad()
def target_features(model, input_ids: torch.Tensor, layer_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the target once.

    Args:
        model: transformers causal LM. input_ids: ``[B, T]``.
        layer_ids: aux layer ids.

    Returns:
        ``(aux [B, T, 3*H], final [B, T, H] post-norm, logits [B, T, V])``.
    """
    out = model(input_ids=input_ids, output_hidden_states=True)
    hs = out.hidden_states  # L + 1 tensors [B, T, H]
    aux = torch.cat([hs[hf_hidden_index(i)] for i in layer_ids], dim=-1)  # [B, T, 3H]
    return aux, hs[-1], out.logits


def write_reference_run(
    run_root,
    target_path,
    samples: list[tuple[str, list[int], list[int]]],
    layer_ids: list[int],
    draft_vocab_size: int,
    dtype: torch.dtype = torch.bfloat16,
) -> None:
    """Write ``data/`` (with ``vocab/draft-N``) and ``features/`` of ``docs/formats.md`` from token sequences.

    The reference writer for tests and the benchmark: features come from the real target in transformers. The draft
    vocabulary is the ``N`` most frequent loss-masked tokens, filled up with the lowest unused ids, sorted by id.

    Args:
        run_root: ``runs/<run>`` folder. samples: ``[(sample_id, input_ids, loss_mask), ...]``.
        layer_ids: aux layer ids. draft_vocab_size: N.
    """
    import hashlib
    import json
    from pathlib import Path

    from safetensors.torch import save_file

    root = Path(run_root)
    (root / "data" / "vocab").mkdir(parents=True, exist_ok=True)
    (root / "features").mkdir(parents=True, exist_ok=True)
    model = load_target(target_path)
    V, H = model.config.vocab_size, model.config.hidden_size
    ids_all = torch.cat([torch.tensor(s[1], dtype=torch.int32) for s in samples])
    mask_all = torch.cat([torch.tensor(s[2], dtype=torch.uint8) for s in samples])
    offsets = torch.tensor([0] + [len(s[1]) for s in samples]).cumsum(0)
    save_file({"input_ids": ids_all, "loss_mask": mask_all, "offsets": offsets},
              str(root / "data" / "samples-00000.safetensors"))
    sha = hashlib.sha256((root / "data" / "samples-00000.safetensors").read_bytes()).hexdigest()
    shard = {"file": "samples-00000.safetensors", "sample_ids": [s[0] for s in samples],
             "lengths": [len(s[1]) for s in samples], "sha256": sha}
    name = Path(target_path).name
    from draftsmith.features.plan import tokenizer_sha256

    tok_sha = tokenizer_sha256(Path(target_path))
    (root / "data" / "manifest.json").write_text(json.dumps(
        {"schema": "draftsmith.data/1", "tokenizer": {"path": str(target_path), "sha256": tok_sha},
         "target_model": name, "max_length": max(shard["lengths"]), "shards": [shard], "config": {}}))
    counts = torch.bincount(ids_all.long()[mask_all.bool()], minlength=V)
    order = torch.argsort(counts, descending=True, stable=True)
    chosen = order[: int((counts > 0).sum().clamp(max=draft_vocab_size))]
    if chosen.numel() < draft_vocab_size:
        rest = torch.tensor([i for i in range(V) if i not in set(chosen.tolist())][: draft_vocab_size - chosen.numel()])
        chosen = torch.cat([chosen, rest])
    chosen = chosen.sort().values
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[chosen] = True
    d2t = chosen - torch.arange(draft_vocab_size)
    save_file({"d2t": d2t, "t2d": t2d}, str(root / "data" / "vocab" / f"draft-{draft_vocab_size}.safetensors"))
    save_file({"counts": counts}, str(root / "data" / "vocab" / "counts.safetensors"))
    (root / "data" / "vocab" / f"draft-{draft_vocab_size}.json").write_text(json.dumps(
        {"schema": "draftsmith.vocab/1", "size": draft_vocab_size, "target_vocab_size": V,
         "coverage": float(counts[chosen].sum() / counts.sum().clamp(min=1)), "data_hash": sha,
         "token_counts_file": "counts.safetensors"}))
    auxs, fins = [], []
    for s in range(0, len(samples), 8):  # right-padded batches: causal attention keeps real rows exact
        chunk = [c[1] for c in samples[s : s + 8]]
        T = max(len(c) for c in chunk)
        batch = torch.tensor([c + [0] * (T - len(c)) for c in chunk])  # [b, T]
        aux, fin, _ = target_features(model, batch, layer_ids)
        for i, c in enumerate(chunk):
            auxs.append(aux[i, : len(c)].to(dtype))  # [T_i, 3H]
            fins.append(fin[i, : len(c)].to(dtype))  # [T_i, H]
    save_file({"aux_hidden": torch.cat(auxs), "final_hidden": torch.cat(fins), "offsets": offsets},
              str(root / "features" / "features-00000.safetensors"))
    (root / "features" / "manifest.json").write_text(json.dumps(
        {"schema": "draftsmith.features/1", "target_model": name, "target_revision": "", "tokenizer_sha256": tok_sha,
         "layer_ids": list(layer_ids), "hidden_size": H, "dtype": str(dtype).removeprefix("torch."),
         "final_hidden": "post_norm", "shards": [{**shard, "file": "features-00000.safetensors"}],
         "data_manifest_sha256": ""}))
