"""A tiny run with training data in the exact format of docs/formats.md §3, built from real chat messages.

Samples are rendered with the SmolLM2 tokenizer's own ``apply_chat_template``; the loss mask covers the assistant
turns' tokens (answer and end-of-turn token). Five conversations in two data shards (3 + 2 samples).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "features"


def render(tok, messages: list[dict]) -> tuple[list[int], list[int]]:
    """Token ids of a conversation and its loss mask (1 on tokens of assistant turns, end-of-turn included)."""
    ids = tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    mask = [0] * len(ids)
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = len(tok.apply_chat_template(messages[:k], tokenize=True, add_generation_prompt=True,
                                            return_dict=True)["input_ids"])
        end = len(tok.apply_chat_template(messages[: k + 1], tokenize=True, return_dict=True)["input_ids"])
        for t in range(start, end):
            mask[t] = 1
    return ids, mask


def build_data(run_dir: Path, target: Path, shard_sizes=(3, 2)) -> dict:
    """Write ``run_dir/data`` (samples-*.safetensors + manifest.json) and return the manifest."""
    from draftsmith.data.render import load_tokenizer, tokenizer_sha256
    from safetensors.torch import save_file

    tok = load_tokenizer(target)
    convs = json.loads((FIXTURES / "conversations.json").read_text())
    data = run_dir / "data"
    data.mkdir(parents=True, exist_ok=True)
    shards, k = [], 0
    for si, n in enumerate(shard_sizes):
        ids_all, mask_all, offsets, sample_ids, lengths = [], [], [0], [], []
        for conv in convs[k : k + n]:
            ids, mask = render(tok, conv)
            ids_all += ids
            mask_all += mask
            offsets.append(len(ids_all))
            sample_ids.append(hashlib.sha256(json.dumps(conv).encode()).hexdigest()[:16])
            lengths.append(len(ids))
        k += n
        f = data / f"samples-{si:05d}.safetensors"
        save_file({"input_ids": torch.tensor(ids_all, dtype=torch.int32),
                   "loss_mask": torch.tensor(mask_all, dtype=torch.uint8),
                   "offsets": torch.tensor(offsets, dtype=torch.int64)}, str(f))
        shards.append({"file": f.name, "sample_ids": sample_ids, "lengths": lengths,
                       "sha256": hashlib.sha256(f.read_bytes()).hexdigest()})
    manifest = {
        "schema": "draftsmith.data/1",
        "tokenizer": {"path": str(target), "sha256": tokenizer_sha256(tok, target)},  # the data stage's own hash
        "target_model": "SmolLM2-135M-Instruct",
        "max_length": 2048,
        "shards": shards,
        "config": {},
    }
    (data / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


@pytest.fixture
def data_run(tmp_path: Path, embedded_target: Path) -> Path:
    """``runs/t`` under a temporary runs folder, with two data shards; returns the run folder."""
    run_dir = tmp_path / "runs" / "t"
    build_data(run_dir, embedded_target)
    return run_dir


@pytest.fixture
def make_settings(embedded_target: Path):
    """Settings for a run folder (overrides merged under ``extract``)."""
    from draftsmith.config import load_settings

    def make(run_dir: Path, **extract):
        return load_settings(overrides={
            "runs_dir": str(run_dir.parent), "run": run_dir.name,
            "target": {"path": str(embedded_target)},
            "extract": {"batch_tokens": 256, **extract},
        })

    return make
