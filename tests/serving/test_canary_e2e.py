"""The canary end to end on real vLLM CPU engines (the embedded target): the small demo's trained drafter is promoted
over a scrambled one, then the scrambled one is rolled back against it; each decision is read back from draftsmith's
own ``/metrics`` and from the run's decisions, and the routes are checked after each."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest
import redis
from draftsmith.artifacts.export import EAGLE3, layout_dir
from draftsmith.config import load_settings
from draftsmith.evaluation.prom import parse_text, total
from draftsmith.metrics import serve_metrics
from draftsmith.paths import RunPaths
from draftsmith.serving.canary import engine_spec, run_canary
from draftsmith.serving.routes import Routes, read_routes, write_routes
from draftsmith.serving.versions import add_version, get_version, read_decisions, read_serving, write_serving
from draftsmith.target.server import VLLMServer, free_port

pytestmark = pytest.mark.slow
RUN = "canary-e2e"


def scrambled(src: Path, out: Path) -> Path:
    """A copy of an exported drafter whose weights are random at the trained ones' scale (same shapes, same
    draft vocabulary): it fits the target and drafts badly."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, out)
    g = torch.Generator().manual_seed(0)
    for f in out.glob("*.safetensors"):
        tensors = load_file(str(f))
        for name, t in tensors.items():
            if t.is_floating_point() and t.numel() > 1 and name.split(".")[-1] not in ("d2t", "t2d"):
                tensors[name] = (torch.randn(t.shape, generator=g) * t.float().std()).to(t.dtype)
        save_file(tensors, str(f), metadata={"format": "pt"})
    return out


def metric(url: str, name: str, **labels: str) -> float:
    return total(parse_text(httpx.get(f"{url}/metrics", timeout=10).text), name, **labels) or 0.0


def test_a_better_drafter_is_promoted_and_a_worse_one_rolled_back(small_demo, embedded_target, tmp_path, redis_url):
    _, run_dir = small_demo
    trained = layout_dir(run_dir / "export", EAGLE3)
    s = load_settings(None, {
        "runs_dir": str(tmp_path / "runs"), "run": RUN, "redis": {"url": redis_url},
        "target": {"path": str(embedded_target), "enforce_eager": True, "max_model_len": 2048, "kv_cache_gib": 1},
        "eval": {"k": 3}, "canary": {"min_requests": 8, "max_tokens": 48, "sets": ["gsm8k"]},
    })
    paths = RunPaths(s.runs_dir, RUN)
    client = redis.Redis.from_url(redis_url)
    v1 = add_version(paths, scrambled(trained, tmp_path / "scrambled"), {"made_by": "test: scrambled weights"})
    mport = free_port()
    serve_metrics(mport)
    murl = f"http://127.0.0.1:{mport}"
    engines = [VLLMServer(engine_spec(s, embedded_target, v1.path), tmp_path / "stable.log")]
    try:
        engines[0].start(timeout_s=900)
        write_routes(client, s.redis.prefix, RUN, Routes(stable=engines[0].url, stable_drafter="v1"))
        write_serving(paths.root, "v1", engines[0].url)
        promotes = metric(murl, "draftsmith_canary_decisions_total", run=RUN, decision="promote")

        up = run_canary(s, trained, client)
        if up.engine is not None:
            engines.append(up.engine)
        r = up.record
        assert up.decision == "promote", r
        assert (r["current"], r["candidate"], r["interval_pairs"]) == ("v1", "v2", 8)
        assert r["interval_low"] > 1.0 and r["interval_candidate_mean"] > r["interval_current_mean"] >= 1.0
        routes = read_routes(client, s.redis.prefix, RUN)
        assert (routes.stable, routes.stable_drafter, routes.canary) == (up.engine.url, "v2", None)
        assert read_serving(paths.root)["version"] == "v2"
        prov = get_version(paths.root, "v2").provenance  # made by the demo run: its checkpoint and data
        assert prov["run"] == str(run_dir.resolve()) and prov["checkpoint"]["step"] > 0 and prov["data_manifest_sha256"]
        assert metric(murl, "draftsmith_canary_decisions_total", run=RUN, decision="promote") == promotes + 1
        assert metric(murl, "draftsmith_serving_drafter_version", run=RUN) == 2
        assert metric(murl, "draftsmith_canary_acceptance_length", run=RUN, version="v2") == pytest.approx(
            r["interval_candidate_mean"])
        engines.pop(0).stop()  # the old stable engine: no route sends it anything now

        rollbacks = metric(murl, "draftsmith_canary_decisions_total", run=RUN, decision="rollback")
        down = run_canary(s, "v1", client)
        d = down.record
        assert down.decision == "rollback" and down.engine is None, d
        assert (d["current"], d["candidate"]) == ("v2", "v1") and d["interval_high"] < 1.0
        after = read_routes(client, s.redis.prefix, RUN)
        assert (after.stable, after.stable_drafter, after.canary, after.canary_share) == (up.engine.url, "v2", None, 0.0)
        with pytest.raises(httpx.TransportError):  # the candidate engine was stopped
            httpx.get(f"{d['candidate_url']}/health", timeout=5)
        assert metric(murl, "draftsmith_canary_decisions_total", run=RUN, decision="rollback") == rollbacks + 1
        assert metric(murl, "draftsmith_serving_drafter_version", run=RUN) == 2
        assert [x["decision"] for x in read_decisions(paths.root)] == ["promote", "rollback"]
    finally:
        for e in engines:
            e.stop()
