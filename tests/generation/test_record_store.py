"""Record storage leftovers: what an interrupted writer leaves is swept or ignored."""

from __future__ import annotations

import json

import pytest
from draftsmith.artifacts.storage import atomic_write_bytes, atomic_write_text
from draftsmith.generation.runcache import DoneIndex
from draftsmith.generation.store import done_ids, rebuild_manifest, sweep_records, write_shard


def rec(i: str) -> dict:
    return {"id": i, "status": "ok", "messages": [], "turns": []}


def test_failed_atomic_write_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "sub" / "x.json"
    target.parent.mkdir()
    atomic_write_text(target, "old")
    with pytest.raises(TypeError):
        atomic_write_bytes(target, 123)  # the write itself fails after the temporary file was opened
    assert sorted(p.name for p in target.parent.iterdir()) == ["x.json"]
    assert target.read_text() == "old"


def test_sweep_removes_temporary_files_and_shards_without_sidecar(tmp_path):
    d = tmp_path / "records"
    write_shard(d, "gen-a", [rec("p1"), rec("p2")])
    (d / ".gen-b.jsonl.tmp-12345").write_text("partial")
    (d / "gen-c.jsonl").write_text(json.dumps(rec("p3")) + "\n")  # killed before its sidecar
    assert sweep_records(d) == {"temp_files": 1, "orphan_shards": 1}
    assert sorted(p.name for p in d.iterdir() if not p.name.startswith(".lock")) == [
        "gen-a.jsonl", "gen-a.meta.json", "shards.idx"]
    assert done_ids(d) == {"p1", "p2"}


def test_journal_is_read_incrementally_and_reloaded_when_rebuilt(tmp_path):
    d = tmp_path / "records"
    write_shard(d, "gen-a", [rec("p1")])
    idx = DoneIndex(d)
    idx.refresh()
    assert idx.ids == {"p1"}
    write_shard(d, "gen-b", [rec("p2"), rec("p1")])  # p1 is dropped as a duplicate
    idx.refresh()
    assert idx.ids == {"p1", "p2"}
    (d / "gen-a.jsonl").unlink()
    (d / "gen-a.meta.json").unlink()  # the user removes a shard to regenerate it
    rebuild_manifest(d)
    idx.refresh()
    assert idx.ids == {"p2"}
    m = json.loads((d / "manifest.json").read_text())
    assert m["records"] == 1 and [s["shard"] for s in m["shards"]] == ["gen-b.jsonl"]


def test_rebuilding_an_unchanged_manifest_rewrites_nothing(tmp_path):
    """`enqueue` rebuilds the manifest on every call; on a finished run it must leave the files as they are
    (found by the stack test: after `make down` / `make up`, `make enqueue` rewrote records/manifest.json)."""
    d = tmp_path / "records"
    write_shard(d, "gen-b", [rec("p1"), rec("p2")])
    write_shard(d, "gen-a", [rec("p4")])  # writers append to the journal in completion order, not shard order
    journal = d / "shards.idx"
    appended = journal.stat().st_mtime_ns
    first = rebuild_manifest(d)
    assert journal.stat().st_mtime_ns == appended, "the journal listed every shard already"
    files = [d / "manifest.json", journal]
    before = [f.stat().st_mtime_ns for f in files]
    assert rebuild_manifest(d) == first
    assert [f.stat().st_mtime_ns for f in files] == before
    write_shard(d, "gen-c", [rec("p3")])
    assert rebuild_manifest(d)["records"] == 4
    assert json.loads(files[0].read_text())["records"] == 4
    (d / "gen-a.jsonl").unlink()
    (d / "gen-a.meta.json").unlink()
    rebuild_manifest(d)
    assert len(journal.read_text().splitlines()) == 2
