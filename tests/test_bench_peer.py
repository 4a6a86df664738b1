"""bench/peer.py's record of a comparison (``peer.json``) and ``--peer-from``'s refusal of a peer side recorded
under other settings (the figures are bench/protocol.py's, tested in tests/test_bench_protocol.py).

No training here: the record is written as the bench writes it and read back under changed settings; the bench
itself needs the peer's virtualenv and vLLM servers, so it runs as ``make peer-quick``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def peer():
    spec = importlib.util.spec_from_file_location("bench_peer", REPO / "bench" / "peer.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_peer"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _args(**kw):
    base = {"epochs": 1, "vocab": 8192, "k": 3, "ttt_steps": 3, "seeds": 3, "prompts": "41-80", "limit": None,
            "max_tokens": 128, "eager": False, "concurrency": 16, "peer_lr": None, "peer_pack": 1024, "peer_all_rows": False,
            "peer_arg": [], "precision": "bf16"}
    return argparse.Namespace(**{**base, **kw})


def _side(peer, name, config, tmp_path):
    runs = [peer.Trained(s, tmp_path / f"{name}-{s}", 90.0 + s,
                         [peer.PromptCounts("gsm8k", "41", 40, 16 + s), peer.PromptCounts("alpaca", "41", 12, 3)],
                         log=str(tmp_path / f"peer-train-seed-{s}.log"), resolved="train:\n  seed: 0\n")
            for s in range(3)]
    return peer.Side(name, config, runs)


@pytest.fixture
def recorded(peer, tmp_path):
    """A kept comparison: ``peer.json`` as the bench writes it, with its conditions and both sides."""
    from protocol import eval_sets, prompt_range

    a = _args()
    sets = eval_sets([], prompt_range(a.prompts))
    cond = peer.conditions(a, "ab" * 32, sets)
    config = peer.peer_config(a, 700, 1115)
    peer.save_record(tmp_path / "peer.json", cond, _side(peer, "draftsmith", {"lr": 1e-3}, tmp_path),
                     _side(peer, "speculators", config, tmp_path))
    return a, sets, cond, config, tmp_path / "peer.json"


def test_the_record_holds_the_conditions_and_both_sides(peer, recorded):
    a, sets, cond, config, path = recorded
    rec = json.loads(path.read_text())
    assert rec["schema"] == "draftsmith.peer-side/2"
    assert rec["conditions"] == {"data_sha256": "ab" * 32, "epochs": 1, "draft_vocab_size": 8192, "k": 3,
                                 "ttt_steps": 3, "seeds": [0, 1, 2], "prompts": "41-80", "limit": None,
                                 "max_tokens": 128, "eager": False, "concurrency": 16, "sets": cond["sets"],
                                 "machine": cond["machine"]}
    assert cond["machine"]["bf16"] in ("amx", "avx512_bf16", "none") and cond["machine"]["torch"] == version("torch")
    assert list(cond["sets"]) == ["mt_bench", "gsm8k", "humaneval", "alpaca"]
    assert all(len(h) == 64 for h in cond["sets"].values())
    assert rec["speculators"]["config"] == {"lr": None, "total_seq_len": 1024, "loss_rows": "generated",
                                            "train_samples": 1114, "hidden_states_dtype": "bfloat16", "extra": [],
                                            "speculators": "0.9.0"}
    assert rec["draftsmith"]["config"] == {"lr": 1e-3}
    assert [r["seed"] for r in rec["speculators"]["runs"]] == [0, 1, 2]
    assert rec["speculators"]["runs"][1]["prompts"][0] == {"set": "gsm8k", "id": "41", "drafts": 40, "accepted": 17}
    # read back under the same settings: the peer side as measured
    back = peer.peer_from(path, cond, config)
    assert back == _side(peer, "speculators", config, path.parent)
    assert back.counts()[2][0].accepted == 18


def test_peer_from_refuses_a_peer_side_recorded_on_other_data(peer, recorded):
    a, sets, cond, config, path = recorded
    with pytest.raises(ValueError, match=r"conditions\.data_sha256: recorded 'abab.*', now 'cdcd") as e:
        peer.peer_from(path, {**cond, "data_sha256": "cd" * 32}, config)
    assert "epochs" not in str(e.value)  # only what differs is named


def test_peer_from_names_every_differing_setting(peer, recorded):
    a, sets, cond, config, path = recorded
    other = peer.conditions(_args(epochs=2, seeds=2, k=4, prompts="1-40"), "ab" * 32, sets)
    with pytest.raises(ValueError) as e:
        peer.peer_from(path, other, peer.peer_config(_args(peer_lr=3e-4, peer_all_rows=True), 700, 1115))
    msg = str(e.value)
    for key in ("conditions.epochs: recorded 1, now 2", "conditions.seeds: recorded [0, 1, 2], now [0, 1]",
                "conditions.k", "conditions.prompts: recorded '41-80', now '1-40'", "speculators.lr: recorded None",
                "speculators.loss_rows: recorded 'generated', now 'all'"):
        assert key in msg, msg
    # a changed set file and a pack of 8,192 tokens
    changed = {**cond, "sets": {**cond["sets"], "gsm8k": "00" * 32}}
    with pytest.raises(ValueError, match=r"conditions\.sets\.gsm8k.*speculators\.total_seq_len: recorded 1024, now "
                                         r"8192"):
        peer.peer_from(path, changed, peer.peer_config(_args(peer_pack=8192), 700, 1115))


def test_a_one_sided_trial_reports_its_side_and_no_ratio(peer, recorded, tmp_path, capsys):
    # --only: a tuning trial of one side prints its figures; a ratio against nothing is never printed
    peer.report(peer.Side("draftsmith", {}), _side(peer, "speculators", {}, tmp_path))
    out = capsys.readouterr().out
    assert "speculators: acceptance length 1.385 (gsm8k 1.425 alpaca 1.250); seeds 0: 1.365 1: 1.385 2: 1.404" in out, out
    assert "RATIO" not in out and "INTERVAL" not in out
    # concurrency is a condition: a peer side measured one prompt at a time is not reused at 16
    a, sets, cond, config, path = recorded
    with pytest.raises(ValueError, match=r"conditions\.concurrency: recorded 16, now 1"):
        peer.peer_from(path, peer.conditions(_args(concurrency=1), "ab" * 32, sets), config)


def test_ours_from_reuses_draftsmiths_side_only_under_its_config(peer, recorded, tmp_path):
    # the peer trained again with other loss rows, against the same draftsmith seeds
    a, sets, cond, config, path = recorded
    back = peer.peer_from(path, cond, {"lr": 1e-3}, side="draftsmith")
    assert back == _side(peer, "draftsmith", {"lr": 1e-3}, path.parent)
    with pytest.raises(ValueError, match=r"draftsmith\.muon_lr: recorded '<absent>', now 0\.005.*--ours-from"):
        peer.peer_from(path, cond, {"lr": 1e-3, "muon_lr": 5e-3}, side="draftsmith")
    one_sided = tmp_path / "trial" / "peer.json"
    one_sided.parent.mkdir()
    peer.save_record(one_sided, cond, peer.Side("draftsmith", {"lr": 1e-3}), _side(peer, "speculators", config,
                                                                                 tmp_path))
    with pytest.raises(ValueError, match="holds no draftsmith side"):
        peer.peer_from(one_sided, cond, {"lr": 1e-3}, side="draftsmith")


def test_trained_from_measures_a_kept_drafter_again_only_if_trained_alike(peer, recorded, tmp_path):
    a, sets, cond, config, path = recorded
    (tmp_path / "speculators-1").mkdir()  # seed 1's drafter folder still exists, the others' do not
    other_prompts = peer.conditions(_args(prompts="1-40", seeds=1), "ab" * 32, sets)
    (tmp_path / "peer-train-seed-1.log").write_text("step 1 loss 9.0\n")
    (tmp_path / "new").mkdir()
    got = peer.trained_before([path.parent], "speculators", config, other_prompts, 1, tmp_path / "new")
    assert got.drafter == tmp_path / "speculators-1" and got.train_s == 91.0 and got.prompts == []
    assert Path(got.log) == tmp_path / "new" / "peer-train-seed-1.log" and "loss 9.0" in Path(got.log).read_text()
    assert peer.trained_before([path.parent], "speculators", config, other_prompts, 0) is None  # folder gone
    other_cpu = {**other_prompts["machine"], "bf16": "amx" if other_prompts["machine"]["bf16"] != "amx" else "none"}
    for changed in ({**other_prompts, "epochs": 2}, {**other_prompts, "data_sha256": "cd" * 32},
                    {**other_prompts, "machine": other_cpu}):
        assert peer.trained_before([path.parent], "speculators", config, changed, 1) is None
    assert peer.trained_before([path.parent], "speculators", {**config, "lr": 3e-3}, other_prompts, 1) is None
    assert peer.trained_before([tmp_path / "nothing-here"], "speculators", config, other_prompts, 1) is None


def test_peer_from_refuses_a_record_without_conditions(peer, tmp_path):
    old = {"drafter": str(tmp_path / "d"), "train_s": 92.0, "prompts": []}  # the layout before the protocol
    (tmp_path / "peer.json").write_text(json.dumps(old))
    with pytest.raises(ValueError, match="older bench/peer.py"):
        peer.peer_from(tmp_path / "peer.json", {}, {})
    with pytest.raises(ValueError, match="does not exist"):
        peer.peer_from(tmp_path / "none" / "peer.json", {}, {})


def test_a_bad_eval_set_stops_the_bench_before_anything_starts(tmp_path):
    # a real command line: the file is read and refused before the peer's venv, a training or a server starts
    bad = tmp_path / "tickets.jsonl"
    bad.write_text('{"question_id": 1, "turns": ["fine"]}\n{"question_id": 2, "prompt": "no turns"}\n')
    p = subprocess.run([sys.executable, str(REPO / "bench" / "peer.py"), "--run", str(tmp_path / "no-run"),
                        "--eval-sets", str(bad)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert p.returncode == 1 and "--eval-sets:" in p.stderr and f"{bad}:2 has no 'turns' list" in p.stderr, p.stderr
    assert "peer-venv" not in p.stdout
    p = subprocess.run([sys.executable, str(REPO / "bench" / "peer.py"), "--quick", "--split", "report",
                        "--prompts", "41-80"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert p.returncode == 2 and "not allowed with argument" in p.stderr  # one way to name the prompts


def test_a_keep_folder_of_an_earlier_run_is_refused_before_anything_starts(tmp_path):
    # a real command line: an earlier run's drafters are kept in KEEP/runs; nothing is trained over them
    (tmp_path / "kept" / "runs" / "ours-seed-0").mkdir(parents=True)
    p = subprocess.run([sys.executable, str(REPO / "bench" / "peer.py"), "--run", str(tmp_path / "no-run"),
                        "--keep", str(tmp_path / "kept")], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert p.returncode == 1 and "already holds an earlier run's runs" in p.stderr, p.stderr
    assert f"--trained-from {tmp_path / 'kept'}" in p.stderr and "peer-venv" not in p.stdout
    assert (tmp_path / "kept" / "runs" / "ours-seed-0").is_dir()
