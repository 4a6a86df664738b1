"""Streamed features equal the stored ones, bit for bit."""

from __future__ import annotations

import json

import torch
from draftsmith.features.jobs import extract_job
from draftsmith.features.stream import FeatureStream
from safetensors.torch import load_file


def test_streamed_equals_stored(data_run, make_settings):
    s = make_settings(data_run)
    for i in range(2):
        extract_job(str(data_run), i, s.model_dump(mode="json"))
    man = json.loads((data_run / "features/manifest.json").read_text())
    stream = FeatureStream.from_settings(s, data_run)
    for i, entry in enumerate(man["shards"]):
        ids, feats = stream.shard(i)
        assert ids == entry["sample_ids"]
        t = load_file(str(data_run / "features" / entry["file"]))
        o = t["offsets"]
        for k, f in enumerate(feats):
            assert f is not None and f.aux.dtype == torch.bfloat16
            assert torch.equal(f.aux, t["aux_hidden"][o[k] : o[k + 1]])
            assert torch.equal(f.final, t["final_hidden"][o[k] : o[k + 1]])
    assert stream.skipped == 0
    # usable in the trainer's autograd graph (no inference tensors)
    w = torch.ones(576, requires_grad=True)
    (feats[0].final.float() * w).sum().backward()
    assert w.grad is not None
