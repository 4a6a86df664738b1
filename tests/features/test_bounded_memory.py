"""Extraction in bounded memory: the shard file is written group by group (``extract.write_tokens``), samples in any
order, and holds exactly the features of extracting the whole shard at once; nothing goes to ``/tmp``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from draftsmith.features.jobs import extract_job, extract_shard, get_extractor
from draftsmith.features.plan import make_plan, read_data_shard
from draftsmith.features.writer import ShardWriter, write_budget, write_groups
from safetensors.torch import load_file, save_file


def _shard(d, i):
    return load_file(str(d / "features" / f"features-{i:05d}.safetensors"))


def _two_per_batch(plan) -> int:
    """A forward budget that puts shard 0's two longest samples in one batch and its third in another."""
    return 2 * max(plan.shards[0]["lengths"])


def test_tiny_budget_gives_the_same_features_and_leaves_tmp_empty(data_run, make_settings, embedded_target, tmp_path,
                                                                 monkeypatch):
    tiny = tmp_path / "tiny" / "t"
    shutil.copytree(data_run, tiny)
    bt = _two_per_batch(make_plan(make_settings(data_run), data_run))
    # reference: each shard in one group (the budget far above the shard), in this process
    s = make_settings(data_run, write_tokens=10**9, batch_tokens=bt)
    # the budgets are host keys: an extraction job takes them from its worker's environment, never from the job
    monkeypatch.setenv("DRAFTSMITH_EXTRACT__BATCH_TOKENS", str(bt))
    monkeypatch.setenv("DRAFTSMITH_EXTRACT__WRITE_TOKENS", str(10**9))
    for i in range(2):
        extract_job(str(data_run), i, s.model_dump(mode="json"))
    plan = make_plan(s, data_run)
    lengths = [plan.shards[0]["lengths"], plan.shards[1]["lengths"]]
    assert [len(g) for g in write_groups(lengths[0], bt, 16)] == [2, 1]  # a group per forward batch
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    env = {**os.environ, "DRAFTSMITH_RUNS_DIR": str(tiny.parent), "DRAFTSMITH_TARGET__PATH": str(embedded_target),
           "DRAFTSMITH_EXTRACT__BATCH_TOKENS": str(bt), "DRAFTSMITH_EXTRACT__WRITE_TOKENS": "16", "TMPDIR": str(tmpdir)}
    p = subprocess.run([sys.executable, "-m", "draftsmith", "extract", "--run", "t", "--sync"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "extracted 2/2 shards, 5 samples" in p.stdout
    for i in range(2):
        got, ref = _shard(tiny, i), _shard(data_run, i)
        assert got.keys() == ref.keys() == {"aux_hidden", "final_hidden", "offsets"}
        for k in ref:
            assert got[k].dtype == ref[k].dtype and torch.equal(got[k], ref[k]), k
    side = json.loads((tiny / "features/features-00001.json").read_text())
    assert side["lengths"] == lengths[1] and side["sample_ids"] == plan.shards[1]["sample_ids"]
    assert list(tmpdir.iterdir()) == []  # nothing written outside the run
    assert sorted(f.name for f in (tiny / "features").iterdir()) == [
        ".lock", "features-00000.json", "features-00000.safetensors", "features-00001.json",
        "features-00001.safetensors", "manifest.json"]


class _PoisonOne:
    """Real features, with a NaN in the sample whose tokens are ``bad`` (wherever its group puts it)."""

    def __init__(self, inner, bad: torch.Tensor) -> None:
        self.inner, self.bad, self.calls = inner, bad, 0

    def extract(self, seqs):
        self.calls += 1
        feats = self.inner.extract(seqs)
        for q, f in zip(seqs, feats, strict=True):
            if torch.equal(q, self.bad):
                f.final[0, 0] = float("nan")
        return feats


def test_a_skipped_sample_is_compacted_away_between_groups(data_run, make_settings):
    s = make_settings(data_run, write_tokens=16, batch_tokens=_two_per_batch(make_plan(make_settings(data_run), data_run)))
    plan = make_plan(s, data_run)
    seqs = read_data_shard(plan.data_dir, plan.shards[0])
    ref = get_extractor(plan, s).extract(seqs)  # the hf batch plan of the whole shard
    x = _PoisonOne(get_extractor(plan, s), seqs[1])
    res = extract_shard(plan, 0, x)
    assert x.calls == 2 and res["samples"] == 2 and res["skipped"] == 1
    t = _shard(data_run, 0)
    keep = [0, 2]
    assert t["offsets"].tolist() == [0, seqs[0].numel(), seqs[0].numel() + seqs[2].numel()]
    assert torch.equal(t["aux_hidden"], torch.cat([ref[i].aux.bfloat16() for i in keep]))
    assert torch.equal(t["final_hidden"], torch.cat([ref[i].final.bfloat16() for i in keep]))
    side = json.loads((data_run / "features/features-00000.json").read_text())
    assert side["sample_ids"] == [plan.shards[0]["sample_ids"][i] for i in keep]
    assert side["skipped"] == [{"id": plan.shards[0]["sample_ids"][1], "reason": "nonfinite"}]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_writer_out_of_order_equals_save_file(tmp_path, dtype):
    g = torch.Generator().manual_seed(0)
    lengths, h = [5, 3, 0, 7, 2], 4
    aux = [torch.randn(n, 3 * h, generator=g).to(dtype) for n in lengths]
    final = [torch.randn(n, h, generator=g).to(dtype) for n in lengths]
    for skip in (set(), {1}, {0, 3}, {0, 1, 2, 3, 4}):
        w = ShardWriter(tmp_path / "w.safetensors", lengths, h, dtype, {"schema": "x"})
        for i in (3, 0, 4, 2, 1):
            w.skip(i) if i in skip else w.put(i, aux[i], final[i])
        keep = w.finish()
        assert keep == [i for i in range(5) if i not in skip]
        off = torch.tensor([0, *[lengths[i] for i in keep]]).cumsum(0)
        save_file({"aux_hidden": torch.cat([aux[i] for i in keep] or [torch.zeros(0, 3 * h, dtype=dtype)]),
                   "final_hidden": torch.cat([final[i] for i in keep] or [torch.zeros(0, h, dtype=dtype)]),
                   "offsets": off}, str(tmp_path / "ref.safetensors"), metadata={"schema": "x"})
        got, ref = load_file(str(tmp_path / "w.safetensors")), load_file(str(tmp_path / "ref.safetensors"))
        assert got.keys() == ref.keys()
        for k in ref:
            assert got[k].dtype == ref[k].dtype and torch.equal(got[k], ref[k]), (skip, k)


def test_writer_refuses_a_wrong_shape_a_repeat_and_a_missing_sample(tmp_path):
    w = ShardWriter(tmp_path / "w.safetensors", [2, 3], 4, torch.bfloat16, {})
    with pytest.raises(ValueError, match=r"expects \[2, 12\]"):
        w.put(0, torch.zeros(3, 12, dtype=torch.bfloat16), torch.zeros(3, 4, dtype=torch.bfloat16))
    w.put(0, torch.zeros(2, 12, dtype=torch.bfloat16), torch.zeros(2, 4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="given twice"):
        w.skip(0)
    with pytest.raises(ValueError, match=r"samples \[1\] were never written"):
        w.finish()
    w.close()


def test_budget_from_free_memory_and_groups_keep_whole_batches():
    # 24 GiB free, H = 576: a quarter over 40 * 576 bytes a token
    assert write_budget(None, 576, 4096, available=24 << 30) == (6 << 30) // (40 * 576)
    assert write_budget(None, 7168, 4096, available=1 << 30) == 4096  # never under one forward pass
    assert write_budget(1000, 576, 4096, available=1) == 1000
    lengths = [10, 50, 20, 40, 30]
    # batches of plan_batches(lengths, 100), longest first: [1, 3], [4, 2, 0]; a group never splits one
    assert write_groups(lengths, 100, 10**6) == [[0, 1, 2, 3, 4]]
    assert write_groups(lengths, 100, 60) == [[1, 3], [0, 2, 4]]
    assert write_groups(lengths, 100, 1) == [[1, 3], [0, 2, 4]]
