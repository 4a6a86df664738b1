"""Record shards on a real S3 store (SeaweedFS): written once, done work from listings, racing writers read once."""

from __future__ import annotations

import json
import os

import pytest
from draftsmith.artifacts.location import (
    is_remote,
    mask_url,
    probe,
    put_if_absent,
    run_key,
    run_location,
)
from draftsmith.artifacts.object_records import ObjectDoneIndex
from draftsmith.artifacts.record_store import record_store
from draftsmith.errors import StorageError
from draftsmith.generation.runcache import done_index, prompt_index
from draftsmith.generation.store import (
    iter_records,
    load_prompts,
    rebuild_manifest,
    record_tally,
    write_shard,
)
from draftsmith.paths import RunPaths


def rec(i: str, status: str = "ok", answer: str = "x") -> dict:
    return {"id": i, "status": status, "messages": [], "turns": [{"content": answer}]}


def test_a_run_url_is_an_object_store_and_a_path_is_local(tmp_path):
    assert is_remote("s3://b/runs") and not is_remote(tmp_path) and not is_remote("runs")
    assert run_location(f"file://{tmp_path}") == tmp_path
    assert str(RunPaths("s3://b/runs", "r1").records) == "s3://b/runs/r1/records"
    assert run_key("s3://b/runs/r1/") == "s3://b/runs/r1"
    assert run_key("runs/r1") == str((tmp_path.cwd() / "runs/r1").resolve())
    assert mask_url("redis://:hunter2@host:6379/0") == "redis://***@host:6379/0"


def test_put_if_absent_creates_once(s3_runs):
    obj = run_location(s3_runs) / "x" / "one.json"
    assert put_if_absent(obj, b"first") is True
    assert put_if_absent(obj, b"second") is False
    assert obj.read_bytes() == b"first"


def test_shards_are_written_once_and_done_work_is_listed(s3_runs):
    d = RunPaths(s3_runs, "r").records
    shard, dropped = write_shard(d, "gen-a", [rec("p1"), rec("p2", status="error")])
    assert dropped == 0 and shard.name.startswith("gen-a.") and shard.name.endswith(".jsonl")
    # a retry of the same job writes beside it, and drops what is done already
    shard2, dropped = write_shard(d, "gen-a", [rec("p2"), rec("p3")])
    assert dropped == 1 and shard2.name != shard.name
    names = sorted(p.name for p in d.iterdir())
    assert len([n for n in names if n.endswith(".meta.json")]) == 2
    tally = record_tally(d)
    assert tally.ids == {"p1", "p2", "p3"} and tally.errors == 1
    assert sorted(r["id"] for r in iter_records(d)) == ["p1", "p2", "p3"]
    manifest = rebuild_manifest(d)
    assert manifest["records"] == 3 and manifest["prompts"] == 3 and manifest["ok"] == 2
    assert json.loads((d / "manifest.json").read_text())["shards"] == manifest["shards"]


def test_a_prompt_written_by_two_racing_hosts_is_read_once(s3_runs):
    d = RunPaths(s3_runs, "race").records
    # host B's index was read before host A wrote p1: both write it (the race put-if-absent cannot see)
    store = record_store(d)
    stale = ObjectDoneIndex(run_key(d))
    write_shard(d, "gen-a", [rec("p1", answer="from A")])
    store.index, fresh = stale, store.index
    write_shard(d, "gen-b", [rec("p1", answer="from B"), rec("p2")])
    store.index = fresh
    records = list(iter_records(d))
    assert sorted(r["id"] for r in records) == ["p1", "p2"]
    first = min(n for n in (p.name for p in d.iterdir()) if n.endswith(".meta.json"))
    kept = next(r for r in records if r["id"] == "p1")["turns"][0]["content"]
    assert kept == ("from A" if first.startswith("gen-a") else "from B")
    assert record_tally(d).ids == {"p1", "p2"}


def test_prompts_and_done_indexes_read_through_the_store(s3_runs):
    paths = RunPaths(s3_runs, "idx")
    paths.prompts.write_text("".join(json.dumps({"id": f"p{i}", "messages": []}) + "\n" for i in range(3)))
    assert sorted(load_prompts(paths.prompts)) == ["p0", "p1", "p2"]
    idx = prompt_index(paths.prompts)
    assert [p["id"] for p in idx.get(["p2", "p9", "p0"])] == ["p2", "p0"]
    paths.prompts.write_text(json.dumps({"id": "q", "messages": []}) + "\n")  # enqueue replaced it
    assert len(prompt_index(paths.prompts)) == 1
    write_shard(paths.records, "gen-x", [rec("p0")])
    assert "p0" in done_index(paths.records)


def test_a_missing_bucket_is_one_clear_line(s3_runs):
    with pytest.raises(StorageError, match=r"bucket of s3://no-such-bucket-xyz/runs/r does not exist"):
        probe(RunPaths("s3://no-such-bucket-xyz/runs", "r").root)


def test_indexes_warmed_before_a_fork_work_in_the_work_horse(s3_runs):
    # the rq worker warms the run caches, then forks a work-horse per job; fsspec's S3 client is not fork-safe
    paths = RunPaths(s3_runs, "fork")
    paths.prompts.write_text(json.dumps({"id": "p0", "messages": []}) + "\n")
    write_shard(paths.records, "gen-a", [rec("p0")])
    prompt_index(paths.prompts)
    done_index(paths.records)
    pid = os.fork()
    if pid == 0:  # the work-horse: refresh both, write a shard, exit 0 only if all of it worked
        code = 1
        try:
            ok = len(prompt_index(paths.prompts)) == 1 and "p0" in done_index(paths.records)
            shard, _ = write_shard(RunPaths(s3_runs, "fork").records, "gen-b", [rec("p1")])
            code = 0 if ok and shard is not None else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert record_tally(paths.records).ids == {"p0", "p1"}


def test_wrong_credentials_are_one_line_without_the_secret(tmp_path, monkeypatch):
    from draftsmith.objectstore import SeaweedFS
    from s3fs import S3FileSystem

    store = SeaweedFS(tmp_path / "weed", identity=("draftsmith", "5e2b8d4f6a1c9e3b7d0f2a4c")).start()
    try:
        for k, v in store.env.items():
            monkeypatch.setenv(k, v)
        S3FileSystem.clear_instance_cache()  # s3fs keeps a client per process: the new endpoint and keys
        store.make_bucket("locked")
        probe(RunPaths("s3://locked/runs", "r").root)  # the right keys pass
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-0d9c8b7a")
        S3FileSystem.clear_instance_cache()
        with pytest.raises(StorageError) as err:
            probe(RunPaths("s3://locked/runs", "r2").root)
        text = str(err.value)
        assert "refused access to s3://locked/runs/r2" in text and "AWS_SECRET_ACCESS_KEY" in text
        assert "wrong-secret" not in text and "5e2b8d4f" not in text
        assert store.sockets(), "weed made no unix sockets: the clean-up below checks nothing"
    finally:
        store.stop()
        S3FileSystem.clear_instance_cache()
    assert store.sockets() == []  # nothing of the server is left in the temporary folder


def test_build_data_pulls_each_prompt_once_into_its_working_copy(s3_runs, tmp_path):
    """``staged(fetch=pull_records)``, as build-data runs it: the store's records come down as one local shard with
    each prompt's first record; a second pull on the same host adds only the prompts written since."""
    from draftsmith.config import Settings
    from draftsmith.generation.store import PULLED_SHARD, pull_records
    from draftsmith.staging import staged

    d = RunPaths(s3_runs, "pulled").records
    write_shard(d, "gen-a", [rec("p1", answer="from A"), rec("p2")])
    write_shard(d, "gen-b", [rec("p3")])
    s = Settings(runs_dir=s3_runs, run="pulled", stage_dir=tmp_path / "stage")
    with staged(s, (), (), fetch=pull_records) as local_s:
        local = RunPaths(local_s.runs_dir, "pulled").records
        assert not is_remote(local) and str(local).startswith(str(tmp_path / "stage"))
        got = {r["id"]: r["turns"][0]["content"] for r in iter_records(local)}
    assert got == {"p1": "from A", "p2": "x", "p3": "x"}
    assert [p.name for p in local.glob("*.jsonl")] == [f"{PULLED_SHARD}.jsonl"]
    write_shard(d, "gen-c", [rec("p4")])
    root = run_location(s3_runs) / "pulled"
    assert pull_records(root, local.parent) == 1
    assert sorted(r["id"] for r in iter_records(local)) == ["p1", "p2", "p3", "p4"]
    with pytest.raises(ValueError, match="pull_records"), staged(s, ("records",), ()):
        pass  # records are read through their format, never copied file by file
