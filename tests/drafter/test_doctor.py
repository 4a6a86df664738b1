"""``draftsmith doctor`` on real broken runs: each copy of one small real run (the drafter tests' reference run:
real SmolLM2 answers and features, a drafter trained two steps on them and exported in both layouts, records holding
the server's own recorded ids) is broken in exactly one way, and the doctor must rank that cause first; on the
healthy copy it finds nothing. The eval report is the default demo's, recorded from a real vLLM run
(tests/fixtures/bench/demo-run)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FIXTURE = FIXTURES / "drafter" / "smollm2_answers.jsonl"  # the answers of the reference run (conftest.py)
LAYER_IDS, MAX_LEN, VOCAB = [1, 14, 26], 160, 2048  # the reference run's (conftest.py)
DEMO_REPORT = FIXTURES / "bench" / "demo-run" / "eval" / "report.json"

pytestmark = pytest.mark.slow  # trains a drafter two steps on the reference run's real SmolLM2 features first
OTHER_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def write_records(root: Path) -> None:
    """``records/`` from the recorded answers, each answer cut where the reference run's samples end."""
    (root / "records").mkdir(exist_ok=True)
    lines = []
    for i, line in enumerate(FIXTURE.read_text().splitlines()):
        r = json.loads(line)
        p, g = r["prompt_token_ids"], r["token_ids"][: max(0, MAX_LEN - len(r["prompt_token_ids"]))]
        lines.append(json.dumps({
            "schema": "draftsmith.record/1", "id": f"s{i:03d}", "status": "ok", "error": None,
            "messages": r["messages"] + [{"role": "assistant", "content": r["answer"], "reasoning": None}],
            "turns": [{"finish_reason": "stop" if len(g) == len(r["token_ids"]) else "length",
                       "prompt_token_ids": p, "token_ids": g}],
            "sampling": {"temperature": 0.0, "top_p": 1.0, "max_tokens": 256, "seed": 0}}))
    (root / "records" / "job-0.jsonl").write_text("\n".join(lines) + "\n")


# the healthy run's training: TRAIN_STEPS steps, held-out points at 1/8, 1/4, 1/2 and the end of them (the learning
# curve data_size reads)
TRAIN = {"draft_vocab_size": VOCAB, "ttt_steps": 2, "batch_size": 4, "batch_tokens": 640, "lr": 1e-3,
         "eval_fraction": 0.1, "eval_every": 1000}
TRAIN_STEPS = 2


def trained_run(runs: Path, name: str, reference_run: Path, target: Path, train: dict, keep_train: int | None = None):
    """A copy of the reference run with records, a drafter trained with ``train`` and exported, the demo's eval
    report; ``keep_train``: only that many training samples stay in the data (the held-out ones all stay: the
    split hashes each sample id)."""
    from draftsmith.config import load_settings
    from draftsmith.drafter.checkpoint import list_checkpoints
    from draftsmith.drafter.data import TrainSamples
    from draftsmith.drafter.families.eagle3.export import export_checkpoint
    from draftsmith.drafter.trainer import Trainer

    root = runs / name
    shutil.copytree(reference_run, root)
    if keep_train is not None:
        train_ids, held_ids = TrainSamples(root / "data").split(train["eval_fraction"])
        kept = set(sorted(train_ids)[:keep_train]) | set(held_ids)  # the reference run's ids: s000, s001, ...
        rewrite_samples(root, lambda i, ids, mask: (ids, mask), keep=lambda i: f"s{i:03d}" in kept)
    s = load_settings(None, {"runs_dir": str(runs), "run": name, "target": {"path": str(target)}, "train": train})
    Trainer(s).run()
    export_checkpoint(list_checkpoints(root / "checkpoints")[-1], str(target), root / "export", "both")
    write_records(root)
    (root / "eval").mkdir()
    shutil.copy(DEMO_REPORT, root / "eval" / "report.json")
    return root


@pytest.fixture(scope="module")
def healthy(reference_run, embedded_target, tmp_path_factory) -> Path:
    """The healthy run: reference data and features, records, a drafter trained and exported, the demo's eval
    report."""
    runs = tmp_path_factory.mktemp("doctor") / "runs"
    return trained_run(runs, "healthy", reference_run, embedded_target, {**TRAIN, "max_steps": TRAIN_STEPS})


@pytest.fixture
def copy(healthy, tmp_path):
    def make() -> Path:
        return Path(shutil.copytree(healthy, tmp_path / "runs" / "broken"))
    return make


def diagnose(root: Path, url: str | None = None, target: Path | None = None):
    from draftsmith.doctor.diagnose import diagnose as run_checks
    from draftsmith.doctor.finding import ranked
    from draftsmith.doctor.run import RunView

    results = run_checks(RunView(root, target=target), url)
    return ranked(results), {r.check: r for r in results}


def edit_configs(root: Path, edit) -> None:
    for lay in ("eagle3", "speculators"):
        f = root / "export" / lay / "config.json"
        f.write_text(json.dumps(edit(json.loads(f.read_text()), lay), indent=2))


def edit_weights(root: Path, edit) -> None:
    for lay in ("eagle3", "speculators"):
        f = root / "export" / lay / "model.safetensors"
        save_file(edit(load_file(str(f))), str(f), metadata={"format": "pt"})


def rewrite_samples(root: Path, make_sample, keep=lambda i: True) -> None:
    """Rewrite the data shard: ``make_sample(index, input_ids list, loss_mask list) -> (ids, mask)`` for each sample
    ``keep(index)`` keeps; the manifest follows."""
    from draftsmith.artifacts import data as data_artifact

    data = root / "data"
    m = data_artifact.read_manifest(data)
    entry = m["shards"][0]
    shard = data_artifact.read_shard(data, entry)
    pairs = zip(shard.input_ids, shard.loss_mask, strict=True)
    kept = [i for i in range(len(entry["sample_ids"])) if keep(i)]
    new = [make_sample(i, ids.tolist(), mask.int().tolist()) for i, (ids, mask) in enumerate(pairs) if keep(i)]
    entry["sample_ids"] = [entry["sample_ids"][i] for i in kept]
    offsets = torch.tensor([0] + [len(ids) for ids, _ in new]).cumsum(0)
    save_file({"input_ids": torch.tensor([t for ids, _ in new for t in ids], dtype=torch.int32),
               "loss_mask": torch.tensor([t for _, mask in new for t in mask], dtype=torch.uint8),
               "offsets": offsets}, str(data / entry["file"]))
    entry["lengths"] = [len(ids) for ids, _ in new]
    m["max_length"] = max(entry["lengths"])
    data_artifact.write_manifest(data, m)


def test_healthy_run_has_no_finding_and_every_offline_check_ran(healthy):
    findings, results = diagnose(healthy)
    assert findings == [], [f.cause for f in findings]
    assert all(r.ran for name, r in results.items() if name not in ("template_live", "data_size")), {
        n: r.note for n, r in results.items() if not r.ran}
    assert results["template_live"].needs_server
    # two steps make two held-out points (step 1 = 1/8..1/2 of the run, and the end): no curve to fit, said so
    assert not results["data_size"].ran and "2 held-out point(s), needs 3" in results["data_size"].note


@pytest.fixture(scope="module")
def little_data(healthy, reference_run, embedded_target) -> Path:
    """The healthy run's settings with 4 of its training samples (one micro-batch) trained 32 steps: 32 passes over
    them; the held-out split is the healthy run's (the split hashes each sample id)."""
    return trained_run(healthy.parent, "little-data", reference_run, embedded_target,
                       {**TRAIN, "max_steps": LITTLE_STEPS}, keep_train=4)


LITTLE_STEPS = 32


def test_too_little_data(little_data):
    """A drafter trained over and over on 4 samples: the training split accepts far more than the held-out one
    (its learning curve: held-out points at steps 4, 8, 16 and 32); data_size names it first, with the curve."""
    from draftsmith.drafter.checkpoint import latest_checkpoint, read_state

    curve = read_state(latest_checkpoint(little_data / "checkpoints"))["learning_curve"]
    assert [(p["step"], p["samples_seen"]) for p in curve] == [(4, 16), (8, 32), (16, 64), (32, 128)]
    last = curve[-1]
    assert last["train"]["accept_len"] - last["heldout"]["accept_len"] >= 0.3, last
    findings, results = diagnose(little_data)
    assert findings[0].check == "data_size", [f.cause for f in findings]
    f = findings[0]
    assert f.cause.startswith("too little data: ") and "memorises its samples" in f.cause, f.cause
    assert "32.00 passes over 4 training samples" in f.evidence and "16: " in f.evidence, f.evidence
    assert f"training split {last['train']['accept_len']:.3f}" in f.evidence
    assert "draftsmith enqueue --run little-data" in f.fix


def test_aux_ids_shifted_by_one(copy):
    root = copy()

    def shift(c, lay):
        if lay == "eagle3":
            c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = list(LAYER_IDS)  # our numbering, not vLLM's
        else:
            c["eagle_aux_hidden_state_layer_ids"] = list(LAYER_IDS)
        return c

    edit_configs(root, shift)
    findings, _ = diagnose(root)
    assert findings[0].check == "export" and "aux layer ids" in findings[0].cause
    assert "[0, 13, 25]" in findings[0].cause and "[2, 15, 27]" in findings[0].fix
    assert len(findings) == 1 and "eagle3/" in findings[0].evidence and "speculators/" in findings[0].evidence


def test_norm_dropped(copy):
    root = copy()
    edit_weights(root, lambda w: {k: v for k, v in w.items() if k != "norm.weight"})
    findings, _ = diagnose(root)
    assert findings[0].check == "export" and "norm.weight" in findings[0].cause


def test_vocabulary_from_other_text(copy, embedded_target):
    from draftsmith.data.vocab import write_draft_vocab
    from draftsmith.drafter.vocab import load_draft_vocab
    from transformers import AutoTokenizer

    root = copy()
    tok = AutoTokenizer.from_pretrained(str(embedded_target))
    text = (Path(__file__).resolve().parents[2] / "shared" / "draftsmith" / "evaluation" / "data" /
            "humaneval.jsonl").read_text()
    ids = torch.tensor(tok(text, add_special_tokens=False)["input_ids"])
    counts = torch.bincount(ids, minlength=len(tok)).long()
    write_draft_vocab(root / "data" / "vocab", VOCAB, counts, "other-text")
    d2t, t2d, _ = load_draft_vocab(root / "data", VOCAB)
    edit_weights(root, lambda w: {**w, "d2t": d2t, "t2d": t2d})
    findings, _ = diagnose(root)
    assert findings[0].check == "coverage", [f.cause for f in findings]
    assert float(findings[0].cause.split("covers ")[1].split("%")[0]) < 85


def test_loss_mask_shifted_by_one_row(copy):
    """Each answer's first token unsupervised and the token after it supervised: 1 row in ~100, below any share
    threshold, but the same shift in every sample is the builder's."""
    root = copy()
    rewrite_samples(root, lambda i, ids, mask: (ids, [0] + mask[:-1]))
    findings, _ = diagnose(root)
    assert findings[0].check == "loss_rows", [f.cause for f in findings]
    # every sample with an answer inside its 160 tokens (one sample's prompt fills them: no generated row)
    assert "shifted by +1 row(s) from the target's tokens in 63 of 63 samples" in findings[0].cause


def test_context_cut_short(copy):
    root = copy()
    rewrite_samples(root, lambda i, ids, mask: (ids[:48], mask[:48]))
    findings, _ = diagnose(root)
    # the prompts alone are 30-70 tokens: most answer tokens were never trained on
    assert findings[0].check == "context", [f.cause for f in findings]
    assert "longest training sample (48 tokens)" in findings[0].cause


def test_temperature_mismatch(copy):
    root = copy()
    rep = json.loads((root / "eval" / "report.json").read_text())
    rep["temperature"] = 1.0
    (root / "eval" / "report.json").write_text(json.dumps(rep))
    findings, _ = diagnose(root)
    assert findings[0].check == "temperature" and "temperature 1" in findings[0].cause


def test_another_chat_template(copy, embedded_target):
    from transformers import AutoTokenizer

    root = copy()
    tok = AutoTokenizer.from_pretrained(str(embedded_target))
    answers = [json.loads(line) for line in FIXTURE.read_text().splitlines()]

    def rerender(i, ids, mask):
        prompt = tok.apply_chat_template(answers[i]["messages"], chat_template=OTHER_TEMPLATE, tokenize=False,
                                         add_generation_prompt=True)
        p = tok(prompt, add_special_tokens=False)["input_ids"]
        seq = (p + answers[i]["token_ids"])[:MAX_LEN]
        return seq, ([0] * len(p) + [1] * len(answers[i]["token_ids"]))[:MAX_LEN]

    rewrite_samples(root, rerender)
    findings, _ = diagnose(root)
    assert findings[0].check == "template", [f.cause for f in findings]
    assert "100% of samples" in findings[0].cause
    assert "position 0: trained ['<', '|', 'user'" in findings[0].evidence and "server ['<|im_start|>'" in findings[0].evidence


def doctor_cli(monkeypatch, runs: Path, target: Path, *args: str) -> int:
    """``draftsmith doctor`` in this process (the console entry point, its exit code)."""
    from draftsmith.cli import main

    monkeypatch.setenv("DRAFTSMITH_RUNS_DIR", str(runs))
    monkeypatch.setenv("DRAFTSMITH_TARGET__PATH", str(target))
    monkeypatch.setattr(sys, "argv", ["draftsmith", "doctor", *args])
    with pytest.raises(SystemExit) as e:
        main()
    return e.value.code


def test_cli_exit_codes_and_json(copy, embedded_target, monkeypatch, tmp_path, capsys):
    root = copy()
    out = tmp_path / "doctor.json"
    assert doctor_cli(monkeypatch, root.parent, embedded_target, "--run", root.name, "--json", str(out)) == 0
    healthy = json.loads(out.read_text())
    assert healthy["findings"] == []
    # each export names the build that made it (its config's code_version, read back)
    assert [(e["layout"], e["code_version"].startswith("draftsmith ")) for e in healthy["exports"]] == [
        ("eagle3", True), ("speculators", True)], healthy["exports"]
    printed = capsys.readouterr().out
    assert "not checked: template_live: needs --url" in printed
    assert f"({healthy['exports'][0]['layout']}): exported by {healthy['exports'][0]['code_version']}" in printed
    edit_weights(root, lambda w: {k: v for k, v in w.items() if k != "norm.weight"})
    assert doctor_cli(monkeypatch, root.parent, embedded_target, "--run", root.name, "--json", str(out)) == 1
    rep = json.loads(out.read_text())
    assert rep["findings"][0]["check"] == "export" and "norm.weight" in rep["findings"][0]["cause"]
    assert "norm.weight" in capsys.readouterr().out
    assert doctor_cli(monkeypatch, root.parent, embedded_target, "--run", "no-such-run") == 2
    assert "no run folder at" in capsys.readouterr().err
    (root / "export" / "eagle3" / "config.json").write_text("{not json")
    assert doctor_cli(monkeypatch, root.parent, embedded_target, "--run", root.name) == 2
    assert "cannot read the drafter export" in capsys.readouterr().err


def write_data(root: Path, samples: list[tuple[str, list[int], list[int]]]) -> None:
    """A data-only run (no features, no drafter): what the live template check reads."""
    from draftsmith.artifacts import data as data_artifact

    (root / "data").mkdir(parents=True)
    f = root / "data" / data_artifact.shard_file(0)
    save_file({"input_ids": torch.tensor([t for _, ids, _ in samples for t in ids], dtype=torch.int32),
               "loss_mask": torch.tensor([t for _, _, m in samples for t in m], dtype=torch.uint8),
               "offsets": torch.tensor([0] + [len(ids) for _, ids, _ in samples]).cumsum(0)}, str(f))
    data_artifact.write_manifest(root / "data", {
        "schema": data_artifact.DATA_SCHEMA, "max_length": MAX_LEN, "config": {},
        "shards": [{"file": f.name, "sample_ids": [s for s, _, _ in samples], "lengths": [len(i) for _, i, _ in samples],
                    "sha256": ""}]})


def test_live_template_round_trip_against_the_served_target(vllm_server, embedded_target, tmp_path):
    """The suite's vLLM server renders the records' prompts with SmolLM2's own template: the data built from the
    server's ids agrees; the same answers rendered with another template do not, and the evidence shows where."""
    from transformers import AutoTokenizer

    answers = [json.loads(line) for line in FIXTURE.read_text().splitlines()[:8]]
    tok = AutoTokenizer.from_pretrained(str(embedded_target))
    good, bad = tmp_path / "good", tmp_path / "bad"
    for root, template in ((good, None), (bad, OTHER_TEMPLATE)):
        samples = []
        for i, a in enumerate(answers):
            p = a["prompt_token_ids"] if template is None else tok(tok.apply_chat_template(
                a["messages"], chat_template=template, tokenize=False, add_generation_prompt=True),
                add_special_tokens=False)["input_ids"]
            g = a["token_ids"][: MAX_LEN - len(p)]
            samples.append((f"s{i:03d}", p + g, [0] * len(p) + [1] * len(g)))
        write_data(root, samples)
        write_records(root)
    _, results = diagnose(good, vllm_server, embedded_target)  # a data-only run names no target of its own
    live = results["template_live"]
    assert live.ran and live.findings == []
    findings, results = diagnose(bad, vllm_server, embedded_target)
    assert results["template_live"].findings, "the live server rendered the foreign template's ids"
    f = results["template_live"].findings[0]
    assert "live server renders 100% of the checked prompts otherwise" in f.cause
    assert "served ['<|im_start|>'" in f.evidence
    assert findings[0].check == "template"


@pytest.mark.parametrize("low_set, named", [("humaneval", True), ("gsm8k", False)])
def test_traffic_unlike_the_training_prompts(copy, low_set, named):
    """The training prompts are GSM8K and Alpaca-like: HumanEval's code prompts accepting little is traffic the
    data lacks; GSM8K's accepting as little is not (its prompts are the nearest), and is not blamed on traffic."""
    root = copy()
    rep = json.loads((root / "eval" / "report.json").read_text())
    rep["results"][0]["sets"][low_set]["acceptance_rate"] = 0.03
    (root / "eval" / "report.json").write_text(json.dumps(rep))
    findings, results = diagnose(root)
    assert results["traffic"].ran
    if named:
        assert findings[0].check == "traffic" and f"eval set {low_set!r} accepts 3.0%" in findings[0].cause
    else:
        assert findings == []
