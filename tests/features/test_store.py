"""Extraction of a real tiny run through the hf backend: store layout, manifest, status, NaN, resume, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from draftsmith.features.jobs import extract_job, extract_shard, get_extractor
from draftsmith.features.plan import make_plan, read_data_shard
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-c", "from draftsmith.cli import main; main()", *args],
                          capture_output=True, text=True, env=env, timeout=300)


def test_extract_job_writes_formats_md_section_4(data_run, make_settings):
    s = make_settings(data_run)
    res = [extract_job(str(data_run), i, s.model_dump(mode="json")) for i in range(2)]
    assert [r["status"] for r in res] == ["done", "done"]
    assert [r["samples"] for r in res] == [3, 2]
    data = json.loads((data_run / "data/manifest.json").read_text())
    man = json.loads((data_run / "features/manifest.json").read_text())
    assert man["schema"] == "draftsmith.features/1"
    assert man["layer_ids"] == [1, 14, 26] and man["vllm_aux_layer_ids"] == [2, 15, 27]
    assert man["hidden_size"] == 576 and man["dtype"] == "bfloat16" and man["final_hidden"] == "post_norm"
    assert man["tokenizer_sha256"] == data["tokenizer"]["sha256"]
    assert man["target_model"] == "SmolLM2-135M-Instruct" and man["target_revision"].startswith("gguf-sha256:")
    for entry, dshard in zip(man["shards"], data["shards"], strict=True):
        assert entry["sample_ids"] == dshard["sample_ids"] and entry["lengths"] == dshard["lengths"]
        t = load_file(str(data_run / "features" / entry["file"]))
        total = sum(dshard["lengths"])
        assert t["aux_hidden"].shape == (total, 3 * 576) and t["aux_hidden"].dtype == torch.bfloat16
        assert t["final_hidden"].shape == (total, 576) and t["final_hidden"].dtype == torch.bfloat16
        assert t["offsets"].tolist() == [0, *torch.tensor(dshard["lengths"]).cumsum(0).tolist()]
    st = json.loads((data_run / "status/extract.json").read_text())
    assert st["shards_done"] == st["shards_total"] == 2
    assert st["samples_done"] == 5 and st["tokens_done"] == sum(sum(d["lengths"]) for d in data["shards"])
    assert st["bytes_written"] > st["tokens_done"] * 4608  # 4608 B/token in bf16 plus headers
    assert st["free_disk_bytes"] > 0 and st["tokens_per_s"] > 0 and st["samples_per_s"] > 0
    # the one snapshot shape (draftsmith.artifacts.status.stage_snapshot): status prints the line without knowing the stage
    assert (st["stage"], st["phase"]) == ("extract", "done") and isinstance(st["updated_at"], float)
    assert st["line"].startswith("shards 2/2, samples 5/5, tokens ")
    # the stored tensors are the model's: sample 1 of shard 0 recomputed on its own
    plan = make_plan(s, data_run)
    seq = read_data_shard(plan.data_dir, plan.shards[0])[1]
    f = get_extractor(plan, s).extract([seq])[0]
    t = load_file(str(data_run / "features/features-00000.safetensors"))
    o = t["offsets"]
    stored, alone = t["aux_hidden"][o[1] : o[2]].float(), f.aux.float()
    if plan.compute_dtype == "float32":
        torch.testing.assert_close(stored, alone, rtol=1e-2, atol=2e-2)
    else:  # bf16 (auto on a CPU with AMX): a batched and a lone forward round differently, row by row
        rel = ((stored - alone).norm(dim=-1) / alone.norm(dim=-1)).max().item()
        assert rel < 0.05, f"largest per-token relative error {rel:.4f}"


class _Poison:
    """Real features with one NaN injected into sample ``bad`` (what a broken kernel or fp16 overflow gives)."""

    def __init__(self, inner, bad: int) -> None:
        self.inner, self.bad = inner, bad

    def extract(self, seqs):
        feats = self.inner.extract(seqs)
        feats[self.bad].aux[3, 7] = float("nan")
        return feats


def test_nan_sample_is_skipped_and_counted(data_run, make_settings):
    s = make_settings(data_run)
    plan = make_plan(s, data_run)
    res = extract_shard(plan, 0, _Poison(get_extractor(plan, s), bad=1))
    assert res["samples"] == 2 and res["skipped"] == 1
    ids = plan.shards[0]["sample_ids"]
    man = json.loads((data_run / "features/manifest.json").read_text())
    assert man["skipped_samples"] == 1
    assert man["shards"][0]["sample_ids"] == [ids[0], ids[2]]
    assert man["shards"][0]["skipped"] == [{"id": ids[1], "reason": "nonfinite"}]
    t = load_file(str(data_run / "features/features-00000.safetensors"))
    assert torch.isfinite(t["aux_hidden"].float()).all()
    assert t["offsets"][-1].item() == plan.shards[0]["lengths"][0] + plan.shards[0]["lengths"][2]
    assert json.loads((data_run / "status/extract.json").read_text())["skipped_samples"] == 1


def test_resume_after_killed_job(data_run, make_settings, embedded_target):
    """A worker SIGKILLed between writing shard 1's temporary file and renaming it: resume redoes only shard 1."""
    s = make_settings(data_run)
    script = textwrap.dedent(f"""
        import os, signal, json
        real_replace = os.replace
        def replace(src, dst):
            if str(dst).endswith("features-00001.safetensors"):
                os.kill(os.getpid(), signal.SIGKILL)   # killed mid-shard: temp file written, never renamed
            return real_replace(src, dst)
        os.replace = replace
        from draftsmith.features.jobs import extract_job
        settings = json.loads({json.dumps(json.dumps(s.model_dump(mode="json")))})
        for i in range(2):
            extract_job({str(data_run)!r}, i, settings)
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert p.returncode == -9, p.stderr[-2000:]
    feats = data_run / "features"
    assert (feats / "features-00000.safetensors").is_file()
    assert not (feats / "features-00001.safetensors").exists() and not (feats / "features-00001.json").exists()
    assert len(list(feats.glob(".features-00001.safetensors.tmp-*"))) == 1
    man = json.loads((feats / "manifest.json").read_text())
    assert [e["file"] for e in man["shards"]] == ["features-00000.safetensors"]
    mtime0 = (feats / "features-00000.safetensors").stat().st_mtime_ns

    res = [extract_job(str(data_run), i, s.model_dump(mode="json")) for i in range(2)]
    assert [r["status"] for r in res] == ["skipped_existing", "done"]
    assert (feats / "features-00000.safetensors").stat().st_mtime_ns == mtime0
    assert not list(feats.glob(".features-*"))
    man = json.loads((feats / "manifest.json").read_text())
    assert [e["file"] for e in man["shards"]] == ["features-00000.safetensors", "features-00001.safetensors"]


def test_cli_sync_extracts_and_resumes(data_run, embedded_target):
    args = ["extract", "--run", "t", "--sync", "--layers", "2,10,20"]
    env = {"DRAFTSMITH_RUNS_DIR": str(data_run.parent), "DRAFTSMITH_TARGET__PATH": str(embedded_target)}
    p = run_cli(*args, env_extra=env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "extracted 2/2 shards, 5 samples" in p.stdout
    man = json.loads((data_run / "data/manifest.json").read_text())
    tokens = sum(sum(e["lengths"]) for e in man["shards"])
    # stated before any model loads: (3 aux + 1 final) x H=576 x 2 bytes (bf16) per token
    assert f"feature store: {tokens * 4608 / 1e9:.2f} GB to write (4,608 B/token x {tokens:,} tokens)" in p.stdout
    assert json.loads((data_run / "features/manifest.json").read_text())["layer_ids"] == [2, 10, 20]
    p = run_cli(*args, env_extra=env)
    assert p.returncode == 0 and "nothing to do" in p.stdout
    assert "skipping 2 already done" in p.stderr
    # other layers into the same store: refused, nothing changed
    p = run_cli("extract", "--run", "t", "--sync", env_extra=env)
    assert p.returncode == 2 and "other layer_ids" in p.stderr
    # queued (no --sync) with nothing to do, on a run whose workers extracted on another backend than this
    # process's (the Compose stack enqueues from the generator container, the extractor runs vLLM): the manifest
    # keeps the workers' backend and is not written again
    from draftsmith.artifacts import features

    feats = data_run / "features"
    features.write_manifest(feats, {**features.load_manifest(feats), "backend": "vllm"})
    mtime = features.manifest_path(feats).stat().st_mtime_ns
    p = run_cli("extract", "--run", "t", "--layers", "2,10,20", env_extra=env)
    assert p.returncode == 0 and "nothing to do" in p.stdout, p.stderr[-2000:]
    assert features.load_manifest(feats)["backend"] == "vllm"
    assert features.manifest_path(feats).stat().st_mtime_ns == mtime


@pytest.mark.parametrize("case", ["layers", "tokenizer", "manifest", "disk"])
def test_bad_input_exits_2_and_writes_nothing(case, data_run, embedded_target):
    env = {"DRAFTSMITH_RUNS_DIR": str(data_run.parent), "DRAFTSMITH_TARGET__PATH": str(embedded_target)}
    args = ["extract", "--run", "t", "--sync"]
    if case == "layers":
        args += ["--layers", "1,14,30"]
        words = "out of range"
    elif case == "tokenizer":
        m = json.loads((data_run / "data/manifest.json").read_text())
        m["tokenizer"]["sha256"] = "0" * 64
        (data_run / "data/manifest.json").write_text(json.dumps(m))
        words = "tokenizer"
    elif case == "manifest":
        (data_run / "data/manifest.json").unlink()
        words = "no training data manifest"
    else:
        env["DRAFTSMITH_EXTRACT__DISK_MARGIN"] = "1e15"
        words = "DRAFTSMITH_TRAIN__FEATURES=stream"
    p = run_cli(*args, env_extra=env)
    assert p.returncode == 2, p.stderr[-2000:]
    assert words in p.stderr and "->" in p.stderr
    assert len(p.stderr.strip().splitlines()) <= 3  # one error line, no traceback
    assert "Traceback" not in p.stderr
    assert not (data_run / "features").exists()


def test_an_unchanged_manifest_is_not_written_again(tmp_path):
    """`extract` rebuilds the manifest before it looks for work; with nothing to do the run's files must stay as they
    were (the stack test's down/up check caught a rewrite), while a changed manifest is written."""
    from draftsmith.artifacts import features

    d = tmp_path / "features"
    d.mkdir()
    m = {"schema": features.FEATURES_SCHEMA, "shards": [], "samples": 0}
    features.write_manifest(d, m)
    f = features.manifest_path(d)
    os.utime(f, ns=(1, 1))
    features.write_manifest(d, dict(m))
    assert f.stat().st_mtime_ns == 1
    features.write_manifest(d, {**m, "samples": 3})
    assert f.stat().st_mtime_ns != 1 and features.load_manifest(d)["samples"] == 3
    f.write_text("{torn")
    features.write_manifest(d, m)
    assert features.load_manifest(d)["samples"] == 0
