"""The refresh loop without engines: the trigger decision on a real records folder and a real Redis, a cycle that
fails at a stage (records that do not build, an export that does not fit) leaving serving.json, the routes and the
run's versions as they were with no lock behind, and two loops on one run refusing each other."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from draftsmith.config import load_settings
from draftsmith.config_serving import RefreshConfig
from draftsmith.errors import DataError, ModelError
from draftsmith.evaluation.vllm_metrics import SpecCounters
from draftsmith.paths import RunPaths
from draftsmith.serving.canary_lock import TrialLock, lock_key
from draftsmith.serving.refresh import STAGES, RefreshBusy, check_trigger, new_version, refresh_cycle
from draftsmith.serving.refresh_trigger import (
    TrafficCount,
    count_traffic,
    data_cutoff,
    decide_refresh,
    live_acceptance,
)
from draftsmith.serving.routes import Routes, read_routes, write_routes
from draftsmith.serving.versions import add_version, list_versions, read_serving, write_serving
from prometheus_client import REGISTRY

RUN = "r"


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _traffic(i: int, at: float, ok: bool = True) -> dict:
    msgs = [{"role": "user", "content": f"def f{i}(x):\n    return x +"}]
    return {"schema": "draftsmith.record/1", "id": f"t{i}", "status": "ok" if ok else "error",
            "error": None if ok else {"reason": "unanswered", "message": "temperature differs", "turn": 0},
            "model": "SmolLM2-135M-Instruct", "messages": msgs + ([{"role": "assistant", "content": f" {i}"}] if ok else []),
            "turns": [], "source": "traffic", "captured_at": _stamp(at), "drafter": "v1", "upstream": "stable"}


def _write_shard(records: Path, name: str, recs: list[dict]) -> None:
    records.mkdir(parents=True, exist_ok=True)
    (records / name).write_text("".join(json.dumps(r) + "\n" for r in recs))


def _export(tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    (d / "model.safetensors").write_bytes(b"weights")
    return d


@pytest.fixture
def serving_run(tmp_path, redis_url, embedded_target):
    """A run served by v1 (routes in Redis, serving.json), with an empty records folder."""
    s = load_settings(None, {"runs_dir": str(tmp_path / "runs"), "run": RUN, "redis": {"url": redis_url},
                             "target": {"path": str(embedded_target)},
                             "refresh": {"min_new_records": 3, "acceptance_floor": 1.5, "min_drafts": 10}})
    paths = RunPaths(s.runs_dir, RUN)
    paths.root.mkdir(parents=True)
    add_version(paths, _export(tmp_path, "v1-export"), {"made_by": "test"})
    write_serving(paths.root, "v1", "http://127.0.0.1:9")
    client = redis.Redis.from_url(redis_url)
    client.delete(lock_key(s.redis.prefix, RUN, "refresh"))
    write_routes(client, s.redis.prefix, RUN, Routes(stable="http://127.0.0.1:9", stable_drafter="v1"))
    return s, paths, client


def test_the_trigger_counts_traffic_captured_after_the_serving_versions_data(serving_run):
    s, paths, client = serving_run
    created = data_cutoff(list_versions(paths.root)[0].provenance)
    assert created == pytest.approx(time.time(), abs=30)
    _write_shard(paths.records, "gen-000.jsonl", [{**_traffic(0, created + 5), "source": None}])  # generated
    _write_shard(paths.records, "traffic-a.jsonl", [_traffic(1, created - 3600), _traffic(2, created + 5),
                                                    _traffic(3, created + 6, ok=False)])
    (paths.records / "traffic-b.jsonl").write_text("not json\n")
    assert count_traffic(paths.records, created) == TrafficCount(answered=1, unanswered=1)
    t = check_trigger(s, client)
    assert (t.refresh, t.reason, t.traffic, t.acceptance) == (False, "", TrafficCount(1, 1), None)
    assert t.line() == "no refresh: 1 new answered traffic records (1 unanswered), live acceptance length -"
    _write_shard(paths.records, "traffic-c.jsonl", [_traffic(4, created + 7), _traffic(5, created + 8)])
    t = check_trigger(s, client)
    assert (t.refresh, t.reason, t.traffic.answered) == (True, "traffic", 3)
    assert count_traffic(paths.records, created + 3600) == TrafficCount(0, 0)  # a refresh's cutoff moves the count


def test_low_live_acceptance_triggers_only_with_new_data_and_enough_drafts():
    cfg = RefreshConfig(min_new_records=100, acceptance_floor=1.5, min_drafts=10)
    before = SpecCounters(drafts=100, accepted=80, has_spec=True)
    low = live_acceptance(SpecCounters(drafts=140, accepted=92, has_spec=True) - before, cfg.min_drafts)
    assert low == pytest.approx(1.3)  # 1 + 12 / 40
    assert live_acceptance(SpecCounters(drafts=105, accepted=84, has_spec=True) - before, 10) is None  # 5 drafts
    assert live_acceptance(SpecCounters(), 10) is None  # no drafter on the engine
    assert decide_refresh(cfg, TrafficCount(2, 0), low).reason == "acceptance"
    assert not decide_refresh(cfg, TrafficCount(0, 4), low).refresh  # nothing new to train on
    assert not decide_refresh(cfg, TrafficCount(2, 0), 1.6).refresh
    assert not decide_refresh(cfg.model_copy(update={"acceptance_floor": None}), TrafficCount(2, 0), low).refresh
    assert decide_refresh(cfg, TrafficCount(100, 0), None).reason == "traffic"


def _assert_untouched(s, paths, client, routes_before):
    assert read_serving(paths.root)["version"] == "v1"
    assert read_routes(client, s.redis.prefix, RUN) == routes_before
    assert [v.name for v in list_versions(paths.root)] == ["v1"]
    assert not client.exists(lock_key(s.redis.prefix, RUN, "refresh"))


def test_a_cycle_that_fails_at_a_stage_leaves_the_serving_drafter_serving_and_no_lock(serving_run, tmp_path):
    s, paths, client = serving_run
    created = data_cutoff(list_versions(paths.root)[0].provenance)
    routes = read_routes(client, s.redis.prefix, RUN)
    # records whose turns do not match their messages: build-data drops every one and refuses, the cycle stops there
    _write_shard(paths.records, "traffic-a.jsonl", [_traffic(i, created + 5) for i in range(4)])
    failed = {"run": RUN, "result": "failed"}
    before = REGISTRY.get_sample_value("draftsmith_refresh_cycles_total", failed) or 0.0
    with pytest.raises(DataError, match="4 of 4 records dropped"):
        refresh_cycle(s, client)
    _assert_untouched(s, paths, client, routes)
    # on /metrics: one failed cycle, the loop idle again, the stage it failed in timed
    assert REGISTRY.get_sample_value("draftsmith_refresh_cycles_total", failed) == before + 1
    stages = {st: REGISTRY.get_sample_value("draftsmith_refresh_stage", {"run": RUN, "stage": st}) for st in STAGES}
    assert stages == {"idle": 1.0, "build": 0.0, "extract": 0.0, "train": 0.0, "canary": 0.0}
    assert REGISTRY.get_sample_value("draftsmith_refresh_stage_seconds", {"run": RUN, "stage": "build"}) > 0
    assert list((paths.root / "refresh").iterdir())  # the failed cycle's work folder stays for inspection
    broken = _export(tmp_path, "broken")
    (broken / "model.safetensors").unlink()
    with pytest.raises(ModelError, match="safetensors"):  # refused before it becomes a version or meets the canary
        new_version(s, paths, broken, {"made_by": "test"})
    _assert_untouched(s, paths, client, routes)


def test_two_refresh_loops_on_one_run_refuse_each_other(serving_run):
    s, paths, client = serving_run
    routes = read_routes(client, s.redis.prefix, RUN)
    with TrialLock(client, s.redis.prefix, RUN, 1.0, name="refresh", busy=RefreshBusy, holder="refresh loop"):
        with pytest.raises(RefreshBusy, match="another refresh loop holds the run's lock"):
            refresh_cycle(s, redis.Redis.from_url(s.redis.url), force=True)
        # a canary trial is a lock of its own: a refresh holding its lock does not keep a trial out
        with TrialLock(client, s.redis.prefix, RUN, 1.0):
            pass
    assert read_routes(client, s.redis.prefix, RUN) == routes and read_serving(paths.root)["version"] == "v1"
    assert refresh_cycle(s, client).version is None  # free again: nothing new, no refresh
