"""The canary without engines: the decision rule's interval, the run's drafter versions, the trial lock in a real
Redis, and what is refused before any engine starts (a corrupt or mismatched export, a second trial on the run)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import redis
from draftsmith.config import load_settings
from draftsmith.errors import DataError, ModelError
from draftsmith.paths import RunPaths
from draftsmith.serving import canary
from draftsmith.serving.canary_lock import CanaryBusy, TrialLock, lock_key
from draftsmith.serving.canary_stats import PROMOTE, ROLLBACK, decide, paired_ratio_interval
from draftsmith.serving.routes import Routes, read_routes, routes_key, write_routes
from draftsmith.serving.versions import add_version, get_version, list_versions, read_serving, write_serving

CURRENT = [1.0, 1.1, 1.0, 1.2, 1.05, 1.0, 1.15, 1.1]
BETTER = [1.6, 1.7, 1.5, 1.8, 1.6, 1.55, 1.75, 1.65]


def test_a_clearly_better_candidate_is_promoted_and_a_worse_one_rolled_back():
    up = paired_ratio_interval(CURRENT, BETTER, confidence=0.9, resamples=2000)
    assert up.ratio == pytest.approx(np.mean(BETTER) / np.mean(CURRENT)) and up.ratio == pytest.approx(13.15 / 8.6)
    assert 1.0 < up.low < up.ratio < up.high and up.pairs == 8
    assert decide(up, 1.0) == PROMOTE and decide(up, up.low + 0.01) == ROLLBACK
    down = paired_ratio_interval(BETTER, CURRENT)
    assert down.ratio == pytest.approx(1 / up.ratio) and down.high < 1.0 and decide(down, 1.0) == ROLLBACK
    again = paired_ratio_interval(CURRENT, BETTER, confidence=0.9, resamples=2000)
    assert (again.low, again.high) == (up.low, up.high)  # seeded: the same numbers, the same decision


def test_equal_drafters_are_not_promoted_and_too_few_pairs_are_refused():
    same = paired_ratio_interval([1.5, 1.5, 1.5], [1.5, 1.5, 1.5])
    assert (same.ratio, same.low, same.high) == (1.0, 1.0, 1.0) and decide(same, 1.0) == ROLLBACK
    noisy = paired_ratio_interval(CURRENT, [x + 0.01 * (-1) ** i for i, x in enumerate(CURRENT)])
    assert noisy.low < 1.0 < noisy.high and decide(noisy, 1.0) == ROLLBACK  # the interval straddles 1: no promotion
    with pytest.raises(DataError, match="1 paired request"):
        paired_ratio_interval([1.2], [1.4])
    with pytest.raises(DataError, match="pair up"):
        paired_ratio_interval([1.2, 1.3], [1.4])


def _export(tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"], "code_version": "abc"}))
    (d / "model.safetensors").write_bytes(b"weights")
    return d


def test_versions_are_numbered_copies_with_provenance_and_serving_names_one(tmp_path):
    paths = RunPaths(tmp_path / "runs", "r")
    paths.root.mkdir(parents=True)
    v1 = add_version(paths, _export(tmp_path, "a"), {"made_by": "test"})
    v2 = add_version(paths, _export(tmp_path, "b"))
    assert (v1.name, v2.name) == ("v1", "v2") and [v.name for v in list_versions(paths.root)] == ["v1", "v2"]
    assert (v2.path / "model.safetensors").read_bytes() == b"weights"
    prov = get_version(paths.root, "v1").provenance
    assert prov["export"] == str((tmp_path / "a").resolve()) and prov["made_by"] == "test"
    assert prov["code_version"] == "abc" and prov["version"] == "v1" and prov["checkpoint"] is None
    assert read_serving(paths.root) is None
    write_serving(paths.root, "v1", "http://a")
    doc = write_serving(paths.root, "v2", "http://b")
    assert (doc["version"], doc["previous"], read_serving(paths.root)["url"]) == ("v2", "v1", "http://b")
    with pytest.raises(ModelError, match=r"no drafter version v7 \(versions: v1, v2\)"):
        get_version(paths.root, "v7")
    with pytest.raises(ModelError, match="no config.json"):
        add_version(paths, tmp_path)


def test_the_trial_lock_refuses_a_second_holder_is_renewed_and_expires_after_a_crash(redis_url):
    client = redis.Redis.from_url(redis_url)
    with TrialLock(client, "ds", "r", timeout_s=1.0):
        with pytest.raises(CanaryBusy, match="another canary trial holds the run's lock"):
            TrialLock(redis.Redis.from_url(redis_url), "ds", "r", timeout_s=1.0).__enter__()
        time.sleep(1.5)  # past the timeout: the heartbeat kept it
        assert client.pttl(lock_key("ds", "r")) > 0
    assert not client.exists(lock_key("ds", "r"))  # released on exit
    client.lock(lock_key("ds", "r"), timeout=1.0).acquire()  # a holder that dies without releasing
    with pytest.raises(CanaryBusy):
        TrialLock(client, "ds", "r", timeout_s=1.0).__enter__()
    time.sleep(1.2)
    with TrialLock(client, "ds", "r", timeout_s=1.0):
        pass


@pytest.fixture
def canary_settings(tmp_path, redis_url, embedded_target):
    s = load_settings(None, {"runs_dir": str(tmp_path / "runs"), "run": "r", "redis": {"url": redis_url},
                             "target": {"path": str(embedded_target)}, "canary": {"min_requests": 4}})
    write_routes(redis.Redis.from_url(redis_url), s.redis.prefix, "r", Routes(stable="http://127.0.0.1:9", stable_drafter="v1"))
    return s


@pytest.fixture
def no_engine(monkeypatch):
    def refuse(self, *a, **kw):
        raise AssertionError("an engine was started")

    monkeypatch.setattr(canary.VLLMServer, "start", refuse)


def _random_export(target: Path, out: Path) -> Path:
    import torch
    from draftsmith.drafter.config import derive_config
    from draftsmith.drafter.families.eagle3.export import write_export
    from draftsmith.drafter.families.eagle3.model import Eagle3Drafter

    torch.manual_seed(0)
    return write_export(Eagle3Drafter(derive_config(target, 64)), out, "eagle3", verifier=str(target))


def test_a_corrupt_or_mismatched_export_is_refused_before_any_engine_starts(canary_settings, embedded_target,
                                                                           tmp_path, no_engine):
    missing = _random_export(embedded_target, tmp_path / "missing")
    for f in missing.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(ModelError, match="has no \\*.safetensors"):
        canary.run_canary(canary_settings, missing)
    other = _random_export(embedded_target, tmp_path / "other")
    cfg = json.loads((other / "config.json").read_text())
    cfg["vocab_size"] = 32000  # made for another target's tokenizer
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="vocabulary mismatch"):
        canary.run_canary(canary_settings, other)
    assert list_versions(RunPaths(canary_settings.runs_dir, "r").root) == []  # nothing refused became a version


def test_a_second_canary_on_the_run_is_refused_while_the_first_holds_the_lock(canary_settings, embedded_target,
                                                                            tmp_path, no_engine):
    good = _random_export(embedded_target, tmp_path / "good")
    client = redis.Redis.from_url(canary_settings.redis.url)
    before = read_routes(client, canary_settings.redis.prefix, "r")
    with TrialLock(client, canary_settings.redis.prefix, "r"):
        with pytest.raises(CanaryBusy):
            canary.run_canary(canary_settings, good)
    assert read_routes(client, canary_settings.redis.prefix, "r") == before  # the serving drafter still serves
    assert list_versions(RunPaths(canary_settings.runs_dir, "r").root) == []


def test_adopting_the_served_drafter_makes_the_first_version_once_and_refuses_a_mismatch(canary_settings,
                                                                                        embedded_target, tmp_path):
    s = canary_settings.model_copy(update={"run": "adopted"})
    client = redis.Redis.from_url(s.redis.url)
    client.delete(routes_key(s.redis.prefix, "adopted"))
    assert read_routes(client, s.redis.prefix, "adopted") is None
    other = _random_export(embedded_target, tmp_path / "other")
    cfg = json.loads((other / "config.json").read_text())
    cfg["vocab_size"] = 32000  # another target's drafter: refused before anything is written
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="vocabulary mismatch"):
        canary.adopt(s, other, "http://target:8000", client)
    root = RunPaths(s.runs_dir, "adopted").root
    assert list_versions(root) == [] and read_routes(client, s.redis.prefix, "adopted") is None
    served = _random_export(embedded_target, tmp_path / "served")
    v, adopted = canary.adopt(s, served, "http://target:8000/", client)
    assert (v.name, adopted) == ("v1", True)
    assert v.provenance["made_by"] == "draftsmith canary --adopt" and v.provenance["served_at"] == "http://target:8000/"
    routes = read_routes(client, s.redis.prefix, "adopted")
    assert (routes.stable, routes.stable_drafter, routes.canary) == ("http://target:8000", "v1", None)
    assert read_serving(root)["version"] == "v1"
    again, adopted = canary.adopt(s, served, "http://target:8000", client)  # `make serve` run a second time
    assert (again.name, adopted) == ("v1", False) and [x.name for x in list_versions(root)] == ["v1"]


def test_the_candidate_engine_listens_where_the_settings_say_and_the_routes_name_it_by_its_service(canary_settings,
                                                                                                  embedded_target,
                                                                                                  tmp_path):
    drafter = _random_export(embedded_target, tmp_path / "d")
    local = canary.engine_spec(canary_settings, embedded_target, drafter)
    assert (local.host, local.url) == ("127.0.0.1", f"http://127.0.0.1:{local.port}")
    s = canary_settings.model_copy(update={"canary": canary_settings.canary.model_copy(
        update={"engine_host": "0.0.0.0", "engine_url_host": "refresh"})})
    spec = canary.engine_spec(s, embedded_target, drafter)
    cmd = spec.command()
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
    assert spec.url == f"http://refresh:{spec.port}"  # what the gateway in another container reaches
    assert local.served_name == embedded_target.name  # no target.model: the folder's name, as `target serve`
    named = s.model_copy(update={"target": s.target.model_copy(update={"model": "target"})})
    # after a promotion the clients' requests keep the model name the stable engine served them under
    assert canary.engine_spec(named, embedded_target, drafter).served_name == "target"
