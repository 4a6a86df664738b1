"""bench/protocol.py's figures: the prompt split, and the ratio of mean acceptance lengths with its interval over
training seeds and prompts, on counts whose answer is known.

The counts are those vLLM's counters give per prompt (drafts, accepted tokens); measuring them needs a vLLM server,
which ``make peer-quick`` runs.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import bootstrap

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def protocol():
    spec = importlib.util.spec_from_file_location("bench_protocol", REPO / "bench" / "protocol.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_protocol"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _counts(protocol, rows):
    return [protocol.PromptCounts("gsm8k", f"p{i}", d, a) for i, (d, a) in enumerate(rows)]


def test_acceptance_length_is_one_plus_accepted_per_draft(protocol):
    assert protocol.acceptance_length(_counts(protocol, [(10, 5), (30, 25)])) == pytest.approx(1.75)
    with pytest.raises(ValueError, match="no draft"):
        protocol.acceptance_length(_counts(protocol, [(0, 0)]))


def test_prompt_range_is_one_based_inclusive_and_knows_the_splits(protocol):
    assert protocol.prompt_range("41-80") == (40, 80)
    assert protocol.prompt_range(" 1 - 40 ") == (0, 40)
    assert protocol.prompt_range("7-7") == (6, 7)
    assert protocol.prompt_range("selection") == (0, 40) and protocol.prompt_range("report") == (40, 80)
    for bad in ("0-40", "41-40", "41", "report2", "41:80", ""):
        with pytest.raises(ValueError, match="FIRST-LAST"):
            protocol.prompt_range(bad)


def test_one_seed_per_side_is_the_paired_bootstrap_over_prompts(protocol):
    base = _counts(protocol, [(40, 16 + i % 5) for i in range(40)])
    ours = _counts(protocol, [(36, 20 + i % 7) for i in range(40)])  # fewer verify steps, more accepted each
    assert protocol.seeded_ratio({0: base}, {0: base}) == (pytest.approx(1.0),) * 3
    ratio, low, high = protocol.seeded_ratio({0: ours}, {0: base})
    want = (1 + sum(20 + i % 7 for i in range(40)) / (36 * 40)) / (1 + sum(16 + i % 5 for i in range(40)) / 1600)
    assert ratio == pytest.approx(want) and 1.0 < low < ratio < high < 1.2
    assert protocol.seeded_ratio({0: ours}, {0: base}) == (ratio, low, high)  # seeded: the same every time
    # scipy's paired percentile bootstrap on the same counts: the same interval up to resampling noise
    cols = [np.array([getattr(p, f) for p in side]) for side in (ours, base) for f in ("accepted", "drafts")]

    def stat(oa, od, ba, bd, axis=-1):
        return (1 + oa.sum(axis) / od.sum(axis)) / (1 + ba.sum(axis) / bd.sum(axis))

    ref = bootstrap(cols, stat, paired=True, vectorized=True, n_resamples=20000, method="percentile",
                    rng=np.random.default_rng(1)).confidence_interval
    assert low == pytest.approx(ref.low, abs=0.004) and high == pytest.approx(ref.high, abs=0.004)


def test_the_seeds_spread_enters_the_interval(protocol):
    # every prompt alike, so only the seeds vary: ours' two seeds accept 1.0 and 0.5 per draft, the base 0.25 on
    # each of three seeds. Drawing ours' two seeds gives {a,a}, {a,b}, {b,b} with probabilities 1/4, 1/2, 1/4,
    # i.e. lengths 2.0, 1.75, 1.5: the 95 % interval spans exactly 1.5 / 1.25 to 2.0 / 1.25
    a = _counts(protocol, [(10, 10)] * 30)
    b = _counts(protocol, [(10, 5)] * 30)
    base = {s: _counts(protocol, [(20, 5)] * 30) for s in (1, 2, 3)}
    ratio, low, high = protocol.seeded_ratio({1: a, 2: b}, base)
    assert ratio == pytest.approx(1.75 / 1.25) and low == pytest.approx(1.2) and high == pytest.approx(1.6)
    # one seed measured on other prompts than the rest is refused
    with pytest.raises(ValueError, match="different prompts"):
        protocol.seeded_ratio({1: a, 2: b[1:]}, base)
    with pytest.raises(ValueError, match="no seed"):
        protocol.seeded_ratio({1: a}, {})


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_eval_sets_cut_the_bundled_sets_and_add_whole_files(protocol, tmp_path):
    own = _jsonl(tmp_path / "support_tickets.jsonl", [{"question_id": 7, "turns": ["Reset my password."]},
                                                      {"turns": ["Why was I billed twice?", "Refund it."]}])
    sets = protocol.eval_sets([own], protocol.prompt_range("report"))
    assert [es.name for es in sets] == [*protocol.BUNDLED, "support_tickets"]
    bundled = {es.name: es for es in sets[:4]}
    for name in protocol.BUNDLED:  # prompts 41-80 of each bundled set, i.e. the file's lines 41 to 80
        lines = (bundled[name].path.read_text().splitlines())[40:80]
        assert [p.turns for p in bundled[name].prompts] == [tuple(json.loads(x)["turns"]) for x in lines]
    assert [(p.id, p.turns) for p in sets[-1].prompts] == [("7", ("Reset my password.",)),
                                                          ("2", ("Why was I billed twice?", "Refund it."))]
    cut = protocol.eval_sets([own], protocol.prompt_range("selection"), limit=1)
    assert [len(es.prompts) for es in cut] == [1] * 5
    first = json.loads(bundled["gsm8k"].path.read_text().splitlines()[0])
    assert cut[1].prompts[0].turns == tuple(first["turns"]) and cut[-1].prompts[0].id == "7"


def test_eval_sets_refuse_bad_files_with_the_fix(protocol, tmp_path):
    from draftsmith.errors import DataError

    with pytest.raises(ValueError, match="not a file"):
        protocol.eval_sets([tmp_path / "missing.jsonl"], (40, 80))
    with pytest.raises(DataError, match="turns"):
        protocol.eval_sets([_jsonl(tmp_path / "bad.jsonl", [{"prompt": "no turns here"}])], (40, 80))
    with pytest.raises(ValueError, match="rename the file"):
        protocol.eval_sets([_jsonl(tmp_path / "gsm8k.jsonl", [{"turns": ["2 + 2?"]}])], (40, 80))
    with pytest.raises(ValueError, match="none in 81-90"):
        protocol.eval_sets([], protocol.prompt_range("81-90"))


def _write_data(data_dir, shards, vocab=None):
    """A run's ``data/`` as build-data lays it out: shards of (sample id, ids, mask) and the manifest."""
    import torch
    from draftsmith.artifacts import data as data_artifact
    from safetensors.torch import save_file

    data_dir.mkdir(parents=True)
    entries = []
    for k, samples in enumerate(shards):
        offsets = torch.tensor([0] + [len(s[1]) for s in samples]).cumsum(0)  # [S+1]
        f = data_dir / data_artifact.shard_file(k)
        save_file({"input_ids": torch.tensor([t for s in samples for t in s[1]], dtype=torch.int32),
                   "loss_mask": torch.tensor([t for s in samples for t in s[2]], dtype=torch.uint8),
                   "offsets": offsets}, str(f))
        entries.append({"file": f.name, "sample_ids": [s[0] for s in samples], "lengths": [len(s[1]) for s in samples],
                        "sha256": "unused"})
    data_artifact.write_manifest(data_dir, {"schema": data_artifact.DATA_SCHEMA, "tokenizer": {"path": "t", "sha256": "x"},
                                            "target_model": "t", "max_length": 8, "shards": entries, "config": {}})
    if vocab is not None:
        (data_dir / "vocab").mkdir()
        save_file({"d2t": torch.tensor(vocab), "t2d": torch.tensor([True, False, True])},
                  str(data_dir / "vocab" / "draft-2.safetensors"))
    return data_dir


def test_data_hash_follows_the_samples_not_their_layout(protocol, tmp_path):
    a, b = ("s1", [5, 6, 7], [0, 1, 1]), ("s0", [9, 4], [0, 1])
    one = protocol.data_sha256(_write_data(tmp_path / "one", [[a, b]], vocab=[0, 1]))
    # the same samples in two shards, in another order: the same data
    assert protocol.data_sha256(_write_data(tmp_path / "two", [[b], [a]], vocab=[0, 1])) == one
    assert len(one) == 64 and int(one, 16)
    # one loss-mask bit, one token, or the draft vocabulary changed: other data
    others = [([[("s1", [5, 6, 7], [1, 1, 1]), b]], [0, 1]), ([[("s1", [5, 6, 8], [0, 1, 1]), b]], [0, 1]),
              ([[a, b]], [0, 2])]
    hashes = {protocol.data_sha256(_write_data(tmp_path / f"o{i}", s, vocab=v)) for i, (s, v) in enumerate(others)}
    assert len(hashes) == 3 and one not in hashes
