"""The stores: each picked once from the run's location, and the only code that asks where a run lives.

A stage reads and writes a run through its stores (records: ``artifacts.record_store``; features:
``features.on_store.feature_store``; checkpoints: ``artifacts.checkpoint_store``; a working copy: ``staging``); the
local-or-remote test, and the object-store implementations themselves, live in those modules only, so a new stage
cannot grow a third strategy of its own.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from draftsmith.artifacts.checkpoint_store import checkpoint_store
from draftsmith.artifacts.features import shard_file, shard_index, sidecar_file
from draftsmith.artifacts.local_checkpoints import LocalCheckpointStore
from draftsmith.artifacts.local_records import LocalRecordStore
from draftsmith.artifacts.object_checkpoints import ObjectCheckpointStore
from draftsmith.artifacts.object_records import ObjectRecordStore
from draftsmith.artifacts.record_store import record_store
from draftsmith.artifacts.storage import free_gb, prepare_run, reachable_here
from draftsmith.features.on_store import ObjectFeatureStore, feature_store
from draftsmith.features.store import LocalFeatureStore

PACKAGE = Path(__file__).resolve().parents[1] / "shared" / "draftsmith"
# the modules that may ask whether a location is an object store: the storage layer and the feature store's factory
STORE_MODULES = ("artifacts/", "staging.py", "features/on_store.py")
REMOTE_TESTS = {"is_remote", "scheme_of"}
# what a stage gets from a store's factory and never builds or calls itself: the object-store implementations and
# the working copy's checkpoint transfers
STORE_INTERNALS = {"ObjectRecordStore", "ObjectFeatureStore", "ObjectCheckpointStore", "put_if_absent"}


def remote_tests(root: Path = PACKAGE, names: set[str] = REMOTE_TESTS) -> list[str]:
    """``file:line name`` for every use of one of ``names`` (default: the remote tests, :data:`REMOTE_TESTS`)
    outside :data:`STORE_MODULES`."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(STORE_MODULES):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            name = (
                node.id
                if isinstance(node, ast.Name)
                else node.attr
                if isinstance(node, ast.Attribute)
                else None
            )
            if name in names:
                out.append(f"{rel}:{node.lineno} {name}")
            if isinstance(node, ast.ImportFrom):
                out += [f"{rel}:{node.lineno} {a.name}" for a in node.names if a.name in names]
    return out


def test_no_stage_asks_where_a_run_lives():
    assert remote_tests() == []


def test_no_stage_builds_an_object_store_or_writes_one_itself():
    """Records, features and checkpoints reach an object store through their store only: the trainer, resume and
    export get a checkpoint store from ``checkpoint_store`` and never push, prune or put-if-absent themselves."""
    assert remote_tests(names=STORE_INTERNALS) == []


def test_a_planted_remote_test_in_a_stage_is_found(tmp_path):
    stage = tmp_path / "generation" / "jobs.py"
    stage.parent.mkdir()
    stage.write_text(
        "from draftsmith.artifacts.location import is_remote\n\nif is_remote('s3://b/r'):\n    pass\n"
    )
    (tmp_path / "artifacts").mkdir()
    (tmp_path / "artifacts" / "location.py").write_text("def is_remote(x):\n    return True\n")
    assert remote_tests(tmp_path) == ["generation/jobs.py:1 is_remote", "generation/jobs.py:3 is_remote"]
    trainer = tmp_path / "drafter" / "trainer.py"
    trainer.parent.mkdir()
    trainer.write_text("from draftsmith.artifacts.object_checkpoints import ObjectCheckpointStore\n")
    assert remote_tests(tmp_path, STORE_INTERNALS) == ["drafter/trainer.py:1 ObjectCheckpointStore"]


def test_each_store_is_picked_once_from_the_location(tmp_path):
    local = record_store(tmp_path / "records")
    assert isinstance(local, LocalRecordStore) and local.location == (tmp_path / "records").resolve()
    assert (
        record_store(str(tmp_path / "records")) is local
    )  # one store per folder and process: its caches kept
    remote = record_store("s3://bucket/runs/r/records/")
    assert isinstance(remote, ObjectRecordStore) and remote.url == "s3://bucket/runs/r/records"
    assert record_store("s3://bucket/runs/r/records") is remote
    assert isinstance(feature_store(tmp_path / "r", tmp_path / "stage"), LocalFeatureStore)
    ckpts = checkpoint_store(tmp_path / "r", tmp_path / "stage")
    assert isinstance(ckpts, LocalCheckpointStore) and ckpts.folder == (tmp_path / "r" / "checkpoints").resolve()
    assert checkpoint_store(str(tmp_path / "r"), tmp_path / "stage") is ckpts
    on_store = checkpoint_store("s3://bucket/runs/r/", tmp_path / "stage")
    assert isinstance(on_store, ObjectCheckpointStore) and str(on_store.remote) == "s3://bucket/runs/r/checkpoints"
    assert on_store.folder.parent.parent.parent == tmp_path / "stage"  # the same working copy as the features'
    assert checkpoint_store("s3://bucket/runs/r", tmp_path / "stage") is on_store
    on_s3 = feature_store("s3://bucket/runs/r", tmp_path / "stage")
    assert isinstance(on_s3, ObjectFeatureStore) and on_s3.key == "s3://bucket/runs/r"
    assert on_s3.local.parent.parent == tmp_path / "stage" and on_s3.local.name == "r"  # its working copy


def test_disk_questions_have_one_answer_per_location(tmp_path):
    assert free_gb("s3://bucket/runs") == float("inf")
    assert 0 < free_gb(tmp_path / "not" / "yet") < float("inf")  # the disk of the nearest existing parent
    assert reachable_here("s3://bucket/runs/r") and reachable_here(tmp_path)
    assert not reachable_here(tmp_path / "absent")
    prepare_run(tmp_path / "r", tmp_path / "r" / "features")
    assert (tmp_path / "r" / "features").is_dir()


def test_feature_file_names_give_their_shard_index():
    assert shard_index(sidecar_file(7)) == 7 and shard_index(shard_file(12)) == 12
    assert shard_index("manifest.json") is None and shard_index("features-x.json") is None


def test_the_local_feature_store_counts_a_shard_once_its_file_and_sidecar_are_there(tmp_path):
    store = feature_store(tmp_path / "r", tmp_path / "stage")
    d = tmp_path / "r" / "features"
    d.mkdir(parents=True)
    for i, n in ((0, 3), (1, 2), (2, 4)):
        side = {
            "file": shard_file(i),
            "data_shard": i,
            "sample_ids": [f"s{i}-{k}" for k in range(n)],
            "lengths": [5] * n,
            "tokens": 5 * n,
            "sha256": "0" * 64,
            "skipped": [],
            "bytes": 10,
            "seconds": 1.0,
        }
        (d / sidecar_file(i)).write_text(json.dumps(side))
        if i != 1:  # shard 1's file is missing: a writer died between the two, it is not done
            (d / shard_file(i)).write_bytes(b"x")
    assert store.done_shards() == {0, 2} and store.sidecar(1) is None
    m = store.rebuild_manifest({"schema": "draftsmith.features/1", "layer_ids": [1, 2, 3]})
    assert [s["file"] for s in m["shards"]] == [shard_file(0), shard_file(2)]
    assert (m["samples"], m["tokens"], m["skipped_samples"], m["layer_ids"]) == (7, 35, 0, [1, 2, 3])
    assert json.loads((d / "manifest.json").read_text())["shards"] == m["shards"]
