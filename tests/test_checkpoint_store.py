"""The checkpoint store, local and on a real S3 store (SeaweedFS): a save is whole or absent, the latest pointer
names a complete checkpoint after a crash mid-save, rotation keeps the newest written, another host's working copy
resumes from the store, and a second trainer saving the same step of a run is refused, not mixed in."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from draftsmith.artifacts.checkpoints import STATE_FILE, read_state
from draftsmith.artifacts.local_checkpoints import LocalCheckpointStore
from draftsmith.artifacts.location import run_location
from draftsmith.artifacts.object_checkpoints import ObjectCheckpointStore
from draftsmith.errors import ModelError, StorageError


def writer(payload: bytes):
    """A checkpoint's tensors stand-in: the store places files, it never reads them."""
    def write(folder: Path) -> None:
        (folder / "model.safetensors").write_bytes(payload)
        (folder / "optimizer.pt").write_bytes(payload[::-1])
    return write


def failing(folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(b"half")
    raise OSError(28, "No space left on device")


def stored(store: ObjectCheckpointStore) -> set[str]:
    """Top-level names of the objects under the store's checkpoints (objects, not the filer's folder names)."""
    fs, base = store.remote.fs, store.remote.path
    return {str(p)[len(base) + 1:].split("/")[0] for p in fs.find(base)}


def test_a_crash_mid_save_leaves_the_last_good_checkpoint(tmp_path):
    store = LocalCheckpointStore(tmp_path / "ck")
    first = store.save(writer(b"one"), {"step": 2}, keep=2)
    with pytest.raises(OSError):
        store.save(failing, {"step": 4}, keep=2)
    assert store.latest() == first and [p.name for p in store.list()] == ["step-00000002"]
    assert read_state(first)["step"] == 2 and json.loads((tmp_path / "ck" / "latest.json").read_text())["step"] == 2
    again = store.save(writer(b"two"), {"step": 4}, keep=2)  # the hidden half folder is replaced
    assert store.latest() == again and (again / "model.safetensors").read_bytes() == b"two"
    with pytest.raises(ModelError, match=r"step-00000002', 'step-00000004"):
        store.resolve("step-00000009")


def test_the_store_sends_each_checkpoint_and_keeps_as_many_as_the_trainer(s3_runs, tmp_path):
    root = run_location(s3_runs) / "r"
    a = ObjectCheckpointStore(root, tmp_path / "host-a" / "checkpoints")
    for step in (2, 4, 6):
        a.save(writer(f"w{step}".encode()), {"step": step}, keep=2)
    assert stored(a) == {"latest.json", "step-00000004", "step-00000006"}
    assert [p.name for p in a.list()] == ["step-00000004", "step-00000006"]
    # another host, an empty working copy: the latest checkpoint comes down, and only it
    b = ObjectCheckpointStore(root, tmp_path / "host-b" / "checkpoints")
    got = b.latest()
    assert got.name == "step-00000006" and (got / "model.safetensors").read_bytes() == b"w6"
    assert sorted(p.name for p in b.folder.iterdir()) == ["latest.json", "step-00000006"]
    assert read_state(got)["saved_ns"] == read_state(a.folder / "step-00000006")["saved_ns"]
    assert b.resolve("step-00000004").name == "step-00000004"  # an older one by name, pulled when asked for
    with pytest.raises(ModelError):
        b.resolve("step-00000002")  # rotated away on the store


def test_a_failed_upload_keeps_the_stores_latest_on_the_last_complete_checkpoint(s3_runs, tmp_path):
    root = run_location(s3_runs) / "r"
    a = ObjectCheckpointStore(root, tmp_path / "a" / "checkpoints")
    a.save(writer(b"good"), {"step": 2}, keep=0)
    # a host lost after sending the weights of step 4 but before its state.json: an incomplete folder on the store
    root.fs.pipe_file(f"{a.remote.path}/step-00000004/model.safetensors", b"partial")
    b = ObjectCheckpointStore(root, tmp_path / "b" / "checkpoints")
    assert b.latest().name == "step-00000002"
    with pytest.raises(ModelError):
        b.resolve("step-00000004")
    # the next trainer saves step 4 whole over the leftover
    b.save(writer(b"whole"), {"step": 4}, keep=1)
    assert stored(b) == {"latest.json", "step-00000004"}
    c = ObjectCheckpointStore(root, tmp_path / "c" / "checkpoints")
    assert (c.latest() / "model.safetensors").read_bytes() == b"whole"


def test_a_second_trainer_saving_the_same_step_is_refused(s3_runs, tmp_path):
    root = run_location(s3_runs) / "r"
    old = ObjectCheckpointStore(root, tmp_path / "old" / "checkpoints")
    old.save(writer(b"old"), {"step": 2}, keep=0)
    time.sleep(0.01)
    a = ObjectCheckpointStore(root, tmp_path / "a" / "checkpoints")
    b = ObjectCheckpointStore(root, tmp_path / "b" / "checkpoints")
    a.save(writer(b"a"), {"step": 2}, keep=0)  # an earlier training's step 2 is replaced, as on a local disk
    a.save(writer(b"a2"), {"step": 2}, keep=0)  # and its own, saved again
    with pytest.raises(StorageError, match="another trainer saved checkpoint step-00000002"):
        b.save(writer(b"b"), {"step": 2}, keep=0)
    fresh = ObjectCheckpointStore(root, tmp_path / "fresh" / "checkpoints").latest()
    assert (fresh / "model.safetensors").read_bytes() == b"a2"
    assert (fresh / STATE_FILE).is_file()
