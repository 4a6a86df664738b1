"""Fixtures of the drafter tests: a small run in the on-disk formats, with features from the real SmolLM2.

The answers in ``tests/fixtures/drafter/smollm2_answers.jsonl`` are real greedy SmolLM2-135M-Instruct outputs,
recorded once from the vLLM CPU server with ``return_token_ids`` (prompt and generated token ids as served).
The features are computed here, from the real target in transformers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "drafter" / "smollm2_answers.jsonl"
LAYER_IDS = [1, 14, 26]
VOCAB = 2048
MAX_LEN = 160


def fixture_samples(limit: int | None = None) -> list[tuple[str, list[int], list[int]]]:
    """``[(id, input_ids, loss_mask)]``: prompt tokens unsupervised, the target's generated tokens supervised."""
    out = []
    for i, line in enumerate(FIXTURE.read_text().splitlines()[:limit]):
        r = json.loads(line)
        ids = r["prompt_token_ids"] + r["token_ids"]
        mask = [0] * len(r["prompt_token_ids"]) + [1] * len(r["token_ids"])
        out.append((f"s{i:03d}", ids[:MAX_LEN], mask[:MAX_LEN]))
    return out


@pytest.fixture(scope="session")
def draft_vocab() -> int:
    """Draft vocabulary size of the reference run."""
    return VOCAB


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory, embedded_target) -> Path:
    """A run folder (data/ + features/) built once per session; copy it before writing into it."""
    from reference_run import write_reference_run

    root = tmp_path_factory.mktemp("ref") / "ref"
    write_reference_run(root, embedded_target, fixture_samples(), LAYER_IDS, VOCAB)
    return root


@pytest.fixture
def run_factory(reference_run, tmp_path, embedded_target):
    """``make(name, **train_overrides) -> Settings`` of a fresh copy of the reference run."""
    from draftsmith.config import load_settings

    def make(name: str = "r", **train):
        runs = tmp_path / "runs"
        if not (runs / name).exists():
            shutil.copytree(reference_run, runs / name)
        base = dict(draft_vocab_size=VOCAB, batch_size=4, batch_tokens=640, eval_fraction=0.15, log_every=2,
                    eval_every=1000, save_every=1000, lr=1e-3, warmup_ratio=0.1)
        base.update(train)
        return load_settings(None, {"runs_dir": str(runs), "run": name, "target": {"path": str(embedded_target)},
                                    "train": base})

    return make
