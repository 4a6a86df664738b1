"""The one reader of the training-data manifest (:mod:`draftsmith.artifacts.data`): extraction and training refuse
the same broken data with the same errors."""

from __future__ import annotations

import json

import pytest
import torch
from draftsmith.artifacts import data as artifact
from draftsmith.errors import DataError


def _write(data_dir, lengths, listed_lengths=None, schema=artifact.DATA_SCHEMA):
    """One shard of ``len(lengths)`` samples; the manifest lists ``listed_lengths`` (default: the true ones)."""
    from safetensors.torch import save_file

    data_dir.mkdir(parents=True, exist_ok=True)
    total = sum(lengths)
    offsets = torch.tensor([0] + lengths).cumsum(0)  # [S+1]
    save_file({"input_ids": torch.arange(total, dtype=torch.int32), "loss_mask": torch.ones(total, dtype=torch.uint8),
               "offsets": offsets}, str(data_dir / artifact.shard_file(0)))
    shard = {"file": artifact.shard_file(0), "sample_ids": [f"s{i}" for i in range(len(lengths))],
             "lengths": listed_lengths or lengths, "sha256": ""}
    artifact.write_manifest(data_dir, {"schema": schema, "tokenizer": {"path": "t", "sha256": "x"},
                                       "target_model": "m", "max_length": 16, "shards": [shard], "config": {}})


def test_read_shard_gives_ids_and_masks(tmp_path):
    _write(tmp_path / "data", [3, 2])
    m = artifact.read_manifest(tmp_path / "data")
    shard = artifact.read_shard(tmp_path / "data", m["shards"][0])
    assert [t.tolist() for t in shard.input_ids] == [[0, 1, 2], [3, 4]]
    assert all(t.dtype == torch.bool and bool(t.all()) for t in shard.loss_mask)


@pytest.mark.parametrize("reader", ["extract", "train"])
def test_both_readers_check_shard_lengths(tmp_path, reader):
    from draftsmith.drafter.data import TrainSamples
    from draftsmith.features.plan import load_data_manifest, read_data_shard

    d = tmp_path / "data"
    _write(d, [3, 2], listed_lengths=[2, 3])
    with pytest.raises(DataError, match="does not match its manifest entry"):
        if reader == "extract":
            read_data_shard(d, load_data_manifest(d)["shards"][0])
        else:
            TrainSamples(d)


@pytest.mark.parametrize("reader", ["extract", "train"])
def test_both_readers_refuse_the_same_manifests(tmp_path, reader):
    from draftsmith.drafter.data import TrainSamples
    from draftsmith.features.plan import load_data_manifest

    read = load_data_manifest if reader == "extract" else TrainSamples
    d = tmp_path / "data"
    with pytest.raises(DataError, match="no training data manifest"):
        read(d)
    _write(d, [3], schema="draftsmith.data/0")
    with pytest.raises(DataError, match="has schema 'draftsmith.data/0'"):
        read(d)
    m = json.loads(artifact.manifest_path(d).read_text())
    artifact.write_manifest(d, {**m, "schema": artifact.DATA_SCHEMA, "shards": []})
    with pytest.raises(DataError, match="holds no sample"):
        read(d)
    artifact.manifest_path(d).write_text("{")
    with pytest.raises(DataError, match="not valid JSON"):
        read(d)


def test_run_paths_name_the_owners_files(tmp_path):
    from draftsmith.artifacts import checkpoints, features, records
    from draftsmith.paths import RunPaths

    p = RunPaths(tmp_path, "r")
    assert p.data_manifest == p.data / artifact.MANIFEST_FILE and p.data_stats == p.data / artifact.STATS_FILE
    assert p.vocab == p.data / artifact.VOCAB_DIR
    assert p.records_manifest == p.records / records.MANIFEST_FILE
    assert p.features_manifest == p.features / features.MANIFEST_FILE
    assert p.checkpoints_latest == p.checkpoints / checkpoints.LATEST_FILE
