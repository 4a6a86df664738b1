"""The reference run of the drafter tests: ``data/`` (with ``vocab/``) and ``features/`` written from token
sequences, with features from the real target in transformers (docs/formats.md §3 and §4).

Test-only: it lives beside the tests, not in the package. It writes through the same owners as the real stages
(:mod:`draftsmith.artifacts` for names, schema tags and manifests; :mod:`draftsmith.data.vocab` for the draft
vocabulary choice), so a change of a contract reaches this writer too.
"""

from __future__ import annotations

from pathlib import Path

import torch
from draftsmith.artifacts import data as data_artifact
from draftsmith.artifacts import features as features_artifact
from draftsmith.data.vocab import count_tokens, data_hash, save_counts, write_draft_vocab
from draftsmith.drafter.hf_features import load_target
from draftsmith.features.layers import hf_hidden_index
from draftsmith.features.plan import sha256_file, tokenizer_sha256

BATCH = 8  # samples per forward pass


@torch.no_grad()
def target_features(model, input_ids: torch.Tensor, layer_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the target once (transformers' ``output_hidden_states``: the output of decoder layer ``i`` is
    ``hidden_states[i + 1]``; ``hidden_states[-1]`` is the last decoder output after the final norm).

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
    """Write ``data/`` (one shard, manifest, ``vocab/counts`` and ``vocab/draft-N``) and ``features/`` (one shard
    and its manifest) of ``run_root``.

    Args:
        run_root: ``runs/<run>`` folder (created).
        target_path: the target checkpoint folder (transformers loads it, its tokenizer is hashed).
        samples: ``[(sample_id, input_ids, loss_mask), ...]``; ``loss_mask`` 1 = supervised.
        layer_ids: aux layer ids (output of decoder layer i).
        draft_vocab_size: N, chosen as ``build-data`` does (:func:`draftsmith.data.vocab.build_draft_vocab`).
        dtype: stored feature dtype.
    """
    from safetensors.torch import save_file

    root = Path(run_root)
    data_dir, features_dir = root / "data", root / "features"
    data_dir.mkdir(parents=True, exist_ok=True)
    features_dir.mkdir(parents=True, exist_ok=True)
    model = load_target(target_path)
    V, H = model.config.vocab_size, model.config.hidden_size
    ids_all = torch.cat([torch.tensor(s[1], dtype=torch.int32) for s in samples])  # [T_total]
    mask_all = torch.cat([torch.tensor(s[2], dtype=torch.uint8) for s in samples])  # [T_total]
    offsets = torch.tensor([0] + [len(s[1]) for s in samples]).cumsum(0)  # [S+1]
    shard_path = data_dir / data_artifact.shard_file(0)
    save_file({"input_ids": ids_all, "loss_mask": mask_all, "offsets": offsets}, str(shard_path))
    shard = {"file": shard_path.name, "sample_ids": [s[0] for s in samples],
             "lengths": [len(s[1]) for s in samples], "sha256": sha256_file(shard_path)}
    name = Path(target_path).name
    tok_sha = tokenizer_sha256(Path(target_path))
    data_artifact.write_manifest(data_dir, {
        "schema": data_artifact.DATA_SCHEMA, "tokenizer": {"path": str(target_path), "sha256": tok_sha},
        "target_model": name, "max_length": max(shard["lengths"]), "shards": [shard], "config": {}})
    counts = count_tokens(ids_all, mask_all, V)  # [V]
    dhash = data_hash([shard["sha256"]])
    vocab_dir = data_artifact.vocab_dir(data_dir)
    save_counts(vocab_dir, counts, dhash)
    write_draft_vocab(vocab_dir, draft_vocab_size, counts, dhash)
    auxs, fins = [], []
    for s in range(0, len(samples), BATCH):  # right-padded batches: causal attention keeps real rows exact
        chunk = [c[1] for c in samples[s : s + BATCH]]
        T = max(len(c) for c in chunk)
        batch = torch.tensor([c + [0] * (T - len(c)) for c in chunk])  # [b, T]
        aux, fin, _ = target_features(model, batch, layer_ids)
        for i, c in enumerate(chunk):
            auxs.append(aux[i, : len(c)].to(dtype))  # [T_i, 3H]
            fins.append(fin[i, : len(c)].to(dtype))  # [T_i, H]
    save_file({"aux_hidden": torch.cat(auxs), "final_hidden": torch.cat(fins), "offsets": offsets},
              str(features_dir / features_artifact.shard_file(0)))
    features_artifact.write_manifest(features_dir, {
        "schema": features_artifact.FEATURES_SCHEMA, "target_model": name, "target_revision": "",
        "tokenizer_sha256": tok_sha, "layer_ids": list(layer_ids), "hidden_size": H,
        "dtype": str(dtype).removeprefix("torch."), "final_hidden": "post_norm",
        "shards": [{**shard, "file": features_artifact.shard_file(0)}], "data_manifest_sha256": ""})
