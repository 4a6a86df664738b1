"""Training on real SmolLM2 features: learning, progress outputs, rotation, exact resume, NaN stop, bad inputs."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from draftsmith.drafter.checkpoint import list_checkpoints, model_state
from draftsmith.drafter.progress import progress_line
from draftsmith.drafter.trainer import Trainer
from draftsmith.drafter.ttt import StepStats
from draftsmith.errors import DataError, ModelError, TrainingError
from draftsmith.precision import native_bf16

pytestmark = pytest.mark.slow  # builds features from the real target and trains (minutes on 2 shared cores)


def test_training_learns_and_reports(run_factory, caplog):
    s = run_factory("learn", ttt_steps=3, max_steps=12, log_every=4, save_every=4, keep=2, eval_every=12)
    caplog.set_level("INFO")
    tr = Trainer(s)
    result = tr.run()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert len(lines) >= 3
    first_loss = float(lines[0].split(" loss ")[1].split()[0])
    last_loss = float(lines[-1].split(" loss ")[1].split()[0])
    assert last_loss < first_loss * 0.8, (first_loss, last_loss)
    assert result["step"] == 12 and len(result["heldout"]["acc"]) == 3
    assert 1.0 <= result["heldout"]["accept_len"] <= 4.0
    # rotation: saves at 4, 8, 12 with keep=2 -> 8 and 12 remain; latest points at 12
    names = [p.name for p in list_checkpoints(tr.paths.checkpoints)]
    assert names == ["step-00000008", "step-00000012"]
    assert json.loads((tr.paths.checkpoints / "latest.json").read_text())["step"] == 12
    status = json.loads((tr.paths.status / "train.json").read_text())
    assert status["step"] == 12 and len(status["train"]["acc"]) == 3
    assert (status["stage"], status["phase"]) == ("train", "done") and isinstance(status["updated_at"], float)
    assert status["line"].startswith("step      12/12 epoch ")
    assert status["precision"] == ("bf16" if native_bf16("cpu") else "fp32")  # train.precision auto, resolved
    from prometheus_client import REGISTRY

    assert REGISTRY.get_sample_value("draftsmith_train_step", {"run": "learn"}) == 12
    # the closing report carries the run's average rate: every token trained over the training time (the
    # held-out passes included in elapsed_s are not training time), never 0
    tokens = REGISTRY.get_sample_value("draftsmith_train_tokens_total", {"run": "learn"})
    assert tokens > 0 and status["tokens_per_s"] >= tokens / status["elapsed_s"]
    assert status["line"].split(" tok/s ")[1].split()[0] == f"{status['tokens_per_s']:,.0f}"
    assert REGISTRY.get_sample_value("draftsmith_train_tokens_per_second", {"run": "learn"}) == status["tokens_per_s"]
    # the learning curve: held-out points at the steps ending 1/8, 1/4, 1/2 of the run (ceil) and at the end, each
    # with what had been trained on by then, the last one the same tokens the metric counted; kept in the checkpoint
    curve = tr.curve
    assert [p["step"] for p in curve] == [2, 3, 6, 12]
    assert [p["samples_seen"] for p in curve] == sorted({p["samples_seen"] for p in curve})
    assert curve[-1]["tokens_seen"] == tokens and curve[-1]["heldout"]["accept_len"] == pytest.approx(
        result["heldout"]["accept_len"], abs=1e-4)
    assert json.loads((list_checkpoints(tr.paths.checkpoints)[-1] / "state.json").read_text())["learning_curve"] == curve


def test_progress_line_format():
    st = StepStats.of([2.0, 3.0], [1.0, 1.0], [1.0, 0.0], [2.0, 2.0])
    line = progress_line(5, 10, 0, st, 1e-4, 1234.0, 65.0)
    assert line == ("step       5/10 epoch 0 loss 2.5000 acc 0.500/0.000 accept_len 1.500 lr 1.000e-04 "
                    "tok/s 1,234 elapsed 0:01:05 eta 0:01:05")


@pytest.mark.parametrize("optimizer,family", [("adamw", "eagle3"), ("muon", "eagle3"), ("adamw", "peagle")])
def test_resume_is_exact(run_factory, optimizer, family):
    """Interrupted at step 4 (after its checkpoint) and resumed == never interrupted, with either optimizer (Muon's
    momentum and AdamW's moments both travel in the checkpoint) and for P-EAGLE (its ``mask_hidden`` too)."""
    kw = dict(ttt_steps=2, max_steps=8, save_every=4, log_every=4, eval_every=100, seed=3, optimizer=optimizer,
              family=family)
    straight = Trainer(run_factory(f"straight-{optimizer}-{family}", **kw))
    straight.run()
    a = model_state(straight.model)
    assert ("mask_hidden" in a) == (family == "peagle")

    s = run_factory(f"interrupted-{optimizer}-{family}", **kw)
    Trainer(s).run(stop_at=5)  # crash after step 5: steps 5.. are lost, step-4 checkpoint remains
    resumed = Trainer(s)
    assert resumed.step == 4 and resumed.position == 4 * 1
    resumed.run()
    b = model_state(resumed.model)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)
    assert resumed.sched.last_epoch == straight.sched.last_epoch == 8
    # the curve continues from the checkpoint's points (steps 1, 2, 4, then 8): the same samples, the same figures
    assert [(p["step"], p["samples_seen"], p["tokens_seen"]) for p in resumed.curve] == [
        (p["step"], p["samples_seen"], p["tokens_seen"]) for p in straight.curve]
    assert [p["step"] for p in straight.curve] == [1, 2, 4, 8]
    for p, q in zip(resumed.curve, straight.curve, strict=True):
        assert p["heldout"]["accept_len"] == pytest.approx(q["heldout"]["accept_len"], abs=1e-4)
    assert [type(o).__name__ for o in resumed.opt] == (["Muon", "AdamW"] if optimizer == "muon" else ["AdamW"])


def test_nan_loss_stops_and_keeps_last_good_checkpoint(run_factory, monkeypatch):
    # no learning-curve points: their held-out passes call ttt_loss too, and the poison counts training calls
    s = run_factory("nan", ttt_steps=2, max_steps=6, save_every=2, eval_every=100, curve_fractions=[])
    tr = Trainer(s)
    import draftsmith.drafter.families.eagle3.objective as objective_mod

    real = objective_mod.ttt_loss
    calls = {"n": 0}

    def poisoned(*a, **k):
        loss, st = real(*a, **k)
        calls["n"] += 1
        return (loss * float("nan"), st) if calls["n"] > 3 else (loss, st)

    monkeypatch.setattr(objective_mod, "ttt_loss", poisoned)
    before = None
    with pytest.raises(TrainingError, match="loss is nan"):
        tr.run()
    names = [p.name for p in list_checkpoints(tr.paths.checkpoints)]
    assert names == ["step-00000002"]
    before = (tr.paths.checkpoints / "step-00000002" / "model.safetensors").read_bytes()
    assert before  # the last good checkpoint is intact


def test_nan_features_are_skipped_and_counted(run_factory):
    s = run_factory("nanfeat", ttt_steps=2, max_steps=2, eval_every=100)
    tr = Trainer(s)
    from nan_features import NaNFeatures  # tests/drafter: a class that pickles for the spawned loader workers

    tr.features = NaNFeatures(tr.features.dir, [tr._rank_batches(0)[0][0]])  # a sample of the first micro-batch
    tr.run()
    assert tr.nan_features >= 1


class _StoredWithOneNaN:
    """Extractor stand-in: the real target features the reference run already stored (computed by the real
    SmolLM2), re-served per sample, with one NaN put into sample ``bad`` (what a broken kernel or an fp16 overflow
    gives; a real NaN cannot be provoked on this CPU target). Saves a second forward pass over the shard."""

    def __init__(self, stored, bad: int) -> None:
        self.stored, self.bad = stored, bad

    def extract(self, seqs):
        from draftsmith.features.hf import SampleFeatures

        out = []
        for k, (a, f) in enumerate(self.stored):
            a, f = a.float().clone(), f.float().clone()  # [T, 3H], [T, H]
            if k == self.bad:
                f[2, 5] = float("nan")
            out.append(SampleFeatures(a, f))
        assert [x.aux.shape[0] for x in out] == [len(q) for q in seqs]
        return out


def test_a_sample_skipped_by_extraction_is_left_out_and_counted(run_factory):
    """Extraction skips and records one NaN sample; training used to refuse the whole run
    ("has no features ... re-run extract") while extract had nothing left to do."""
    from draftsmith.drafter.data import OfflineFeatures
    from draftsmith.features.jobs import extract_shard
    from draftsmith.features.plan import make_plan

    s = run_factory("skipped", ttt_steps=2, max_steps=2, eval_every=100, eval_fraction=0.0)
    root = s.runs_dir / "skipped"
    ref = OfflineFeatures(root / "features")
    stored = ref.get(json.loads((root / "data" / "manifest.json").read_text())["shards"][0]["sample_ids"])
    shutil.rmtree(root / "features")
    plan = make_plan(s, root)
    res = extract_shard(plan, 0, _StoredWithOneNaN(stored, bad=3))  # the real extraction code path from here
    bad = plan.shards[0]["sample_ids"][3]
    assert res["skipped"] == 1 and res["samples"] == len(plan.shards[0]["sample_ids"]) - 1
    assert extract_shard(plan, 0, None)["status"] == "skipped_existing"  # re-running extract: nothing to do
    tr = Trainer(s)
    assert tr.extract_skipped == 1 and bad not in tr.train_ids and len(tr.train_ids) == res["samples"]
    result = tr.run()
    assert result["step"] == 2 and result["extract_skipped_samples"] == 1 and result["nan_feature_samples"] == 0
    status = json.loads((tr.paths.status / "train.json").read_text())
    assert status["extract_skipped_samples"] == 1
    with pytest.raises(DataError, match="skipped by extraction"):
        tr.features.get([bad])


def test_bad_inputs_fail_before_anything_is_written(run_factory, tmp_path):
    s = run_factory("bad", ttt_steps=2, max_steps=2)
    root = s.runs_dir / "bad"
    with pytest.raises(DataError, match="no draft vocabulary of size 999"):
        Trainer(s.model_copy(update={"train": s.train.model_copy(update={"draft_vocab_size": 999})}))
    # features of another target (hidden size differs)
    man = json.loads((root / "features" / "manifest.json").read_text())
    (root / "features" / "manifest.json").write_text(json.dumps({**man, "hidden_size": 4096}))
    with pytest.raises(DataError, match="another target"):
        Trainer(s)
    (root / "features" / "manifest.json").write_text(json.dumps(man))
    # an empty dataset
    dman = json.loads((root / "data" / "manifest.json").read_text())
    (root / "data" / "manifest.json").write_text(json.dumps({**dman, "shards": []}))
    with pytest.raises(DataError, match="holds no sample"):
        Trainer(s)
    (root / "data" / "manifest.json").write_text(json.dumps(dman))
    assert not (root / "checkpoints").exists() and not (root / "status").exists()
    # a corrupt checkpoint, then one from another architecture: clear errors, nothing overwritten
    Trainer(s).run()
    ck = list_checkpoints(root / "checkpoints")[-1]
    good = (ck / "model.safetensors").read_bytes()
    (ck / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ModelError, match="corrupt"):
        Trainer(s)
    (ck / "model.safetensors").write_bytes(good)
    two = s.model_copy(update={"train": s.train.model_copy(update={"num_layers": 2})})
    with pytest.raises(ModelError, match="another architecture"):
        Trainer(two)
    assert (ck / "model.safetensors").read_bytes() == good
    shutil.rmtree(root)


def test_streamed_features_plug_in(run_factory):
    """train.features=stream: the extraction stage's FeatureStream feeds the trainer through the FeatureSource
    protocol; its values equal the stored shards (both bf16 from the same target) and a step trains."""
    from draftsmith.drafter.data import OfflineFeatures, StreamedFeatures

    s = run_factory("stream", ttt_steps=2, max_steps=1, eval_fraction=0.0)
    s = s.model_copy(update={"train": s.train.model_copy(update={"features": "stream"}),
                             # the stored reference shards were computed in float32 (auto is bf16 on AMX CPUs)
                             "extract": s.extract.model_copy(update={"compute_dtype": "float32"})})
    tr = Trainer(s)
    assert isinstance(tr.features, StreamedFeatures) and tr.features.layer_ids == [1, 14, 26]
    sid = tr.train_ids[0]
    (a1, f1), = tr.features.get([sid])
    (a0, f0), = OfflineFeatures(tr.paths.features).get([sid])
    assert a1.shape == a0.shape and f1.shape == f0.shape
    torch.testing.assert_close(a1.float(), a0.float(), rtol=0.02, atol=0.05)
    torch.testing.assert_close(f1.float(), f0.float(), rtol=0.02, atol=0.05)
    assert tr.run()["step"] == 1
