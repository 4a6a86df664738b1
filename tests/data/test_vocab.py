"""Draft vocabulary: offsets round-trip, exactly N kept, coverage, rebuilding another N from stored counts."""

from __future__ import annotations

import json

import pytest
import torch
from draftsmith.data.vocab import (
    build_draft_vocab,
    count_tokens,
    data_hash,
    load_counts,
    save_counts,
    write_draft_vocab,
)
from draftsmith.errors import DataError
from safetensors.torch import load_file


def test_top_n_offsets_round_trip():
    counts = torch.tensor([0, 5, 1, 9, 0, 3, 3, 7], dtype=torch.int64)  # V = 8
    d2t, t2d, cov = build_draft_vocab(counts, 4)
    kept = torch.arange(4) + d2t
    assert kept.tolist() == [1, 3, 5, 7]  # top-4 counts 9, 7, 5, 3 (tie 5/6 -> lower id), sorted by id
    assert d2t.tolist() == [1, 2, 3, 4]
    assert int(t2d.sum()) == 4 and t2d.nonzero().flatten().tolist() == [1, 3, 5, 7]
    assert cov == pytest.approx((5 + 9 + 3 + 7) / 28)


def test_unseen_tokens_fill_by_lowest_id():
    counts = torch.tensor([0, 0, 4, 0, 1], dtype=torch.int64)
    d2t, t2d, cov = build_draft_vocab(counts, 3)
    assert (torch.arange(3) + d2t).tolist() == [0, 2, 4] and int(t2d.sum()) == 3 and cov == 1.0


def test_size_out_of_range():
    with pytest.raises(DataError, match="outside"):
        build_draft_vocab(torch.ones(10, dtype=torch.int64), 11)


def test_count_only_supervised_tokens():
    ids = torch.tensor([7, 1, 1, 2, 7], dtype=torch.int32)
    mask = torch.tensor([0, 1, 1, 1, 0], dtype=torch.uint8)
    assert count_tokens(ids, mask, 8).tolist() == [0, 2, 1, 0, 0, 0, 0, 0]


def test_rebuild_another_n_from_stored_counts(tmp_path):
    counts = torch.tensor([3, 0, 2, 8, 1, 0], dtype=torch.int64)
    h = data_hash(["aa", "bb"])
    save_counts(tmp_path, counts, h)
    got, got_h = load_counts(tmp_path)
    assert torch.equal(got, counts) and got_h == h
    for n in (2, 4):
        meta = write_draft_vocab(tmp_path, n)
        t = load_file(tmp_path / f"draft-{n}.safetensors")
        assert t["d2t"].dtype == torch.int64 and t["t2d"].dtype == torch.bool and t["d2t"].shape == (n,)
        assert int(t["t2d"].sum()) == n
        on_disk = json.loads((tmp_path / f"draft-{n}.json").read_text())
        assert on_disk == meta and meta["schema"] == "draftsmith.vocab/1" and meta["data_hash"] == h
    assert json.loads((tmp_path / "draft-2.json").read_text())["coverage"] == pytest.approx(11 / 14, abs=1e-6)


def test_missing_counts(tmp_path):
    with pytest.raises(DataError, match="build-data"):
        load_counts(tmp_path)
