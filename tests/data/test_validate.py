"""Token-exact validation on real SmolLM2 records from the vLLM CPU server, a one-token difference, and the seed's
bug (reasoning not wrapped in the model's thinking tokens) caught before any training."""

from __future__ import annotations

import copy

import pytest
from conftest import TEMPLATES, make_record, write_records
from draftsmith.config import DataConfig
from draftsmith.data.build import build_data
from draftsmith.data.render import ChatRenderer, end_of_turn_ids, load_tokenizer
from draftsmith.data.validate import first_difference, validate_sample
from draftsmith.errors import DataError

SMOL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def smol(embedded_target):
    tok = load_tokenizer(embedded_target)
    return ChatRenderer(tok, end_of_turn_ids(tok, embedded_target))


def test_real_records_are_token_exact(smol, smollm2_records):
    for rec in smollm2_records:
        for s in smol.render(rec):
            assert validate_sample(s, smol.tok) == []


def test_real_record_mask_token_by_token(smol, smollm2_records):
    """The server's ids end with <|im_end|> (id 2) on stop; the template's trailing newline is not generated."""
    rec = smollm2_records[0]
    assert rec["turns"][0]["token_ids"][-1] == 2
    (s,) = smol.render(rec)
    toks = smol.tok.convert_ids_to_tokens(s.input_ids)
    start = s.spans[0].start
    assert toks[start - 4 : start] == ["<|im_start|>", "ass", "istant", "Ċ"] and s.loss_mask[start - 4 : start] == [0] * 4
    assert s.input_ids[start : start + 2] == rec["turns"][0]["token_ids"][:2] and s.loss_mask[start] == 1
    assert toks[s.spans[0].end - 1] == "<|im_end|>" and s.loss_mask[s.spans[0].end - 1] == 1
    assert toks[-1] == "Ċ" and s.loss_mask[-1] == 0
    assert sum(s.loss_mask) == len(rec["turns"][0]["token_ids"])
    # system prompt (the template's default) and user turn are never supervised
    assert not any(s.loss_mask[:start])


def test_length_cut_turn_supervises_no_end_of_turn(smol, smollm2_records):
    rec = smollm2_records[2]
    assert rec["turns"][0]["finish_reason"] == "length"
    (s,) = smol.render(rec)
    sp = s.spans[0]
    assert s.input_ids[sp.start : sp.end] == rec["turns"][0]["token_ids"]
    assert s.input_ids[sp.end] == 2 and s.loss_mask[sp.end] == 0  # rendered <|im_end|>, never generated


def test_one_token_difference_is_caught(smol, smollm2_records):
    rec = copy.deepcopy(smollm2_records[1])
    rec["turns"][1]["token_ids"][3] += 1
    bad = [m for s in smol.render(rec) for m in validate_sample(s, smol.tok)]
    assert len(bad) == 1
    m = bad[0]
    assert (m.turn, m.position) == (1, 3)
    assert m.rendered != m.generated and m.rendered_len == m.generated_len == 8
    assert "first difference at generated token 3" in m.describe()


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_build_fails_on_mismatch_above_threshold(tmp_path, embedded_target, smollm2_records):
    recs = copy.deepcopy(smollm2_records)
    recs[0]["turns"][0]["token_ids"][0] = 9999
    write_records(tmp_path / "records", recs)
    with pytest.raises(DataError, match=r"1 of 4 turns are not token-exact"):
        build_data(tmp_path / "records", tmp_path / "data", embedded_target, DataConfig(), SMOL)
    assert not (tmp_path / "data" / "manifest.json").exists()
    # a tolerant threshold keeps the build going and drops only the bad record
    res = build_data(tmp_path / "records", tmp_path / "data", embedded_target,
                     DataConfig(max_mismatch_rate=0.5, max_drop_rate=0.5), SMOL)
    assert res.stats["dropped_by_reason"] == {"token_mismatch": 1} and res.stats["samples"] == 2
    assert res.stats["mismatches"][0]["position"] == 0


def test_seed_bug_unwrapped_reasoning_is_caught(tmp_path):
    """The seed concatenated reasoning and answer with no thinking tokens; the server's ids carry <think>...</think>."""
    folder = TEMPLATES / "qwen3"
    tok = load_tokenizer(folder)
    r = ChatRenderer(tok, end_of_turn_ids(tok, folder))
    reasoning, answer = "2 + 3 = 5.", "The answer is 5."
    served = tok(f"<think>\n{reasoning}\n</think>\n\n{answer}<|im_end|>", add_special_tokens=False)["input_ids"]
    seed_rec = make_record("seed", [("What is 2+3?", f"{reasoning}\n\n{answer}", None, served)])
    bad = [m for s in r.render(seed_rec) for m in validate_sample(s, tok)]
    assert len(bad) == 1 and bad[0].position == 0
    assert bad[0].generated.startswith("<think>") and bad[0].rendered.startswith("2 + 3")
    # the same generation recorded with its reasoning field renders token-exactly
    good = make_record("good", [("What is 2+3?", answer, reasoning, served)])
    assert [m for s in r.render(good) for m in validate_sample(s, tok)] == []
    # and the build refuses the seed's data outright
    write_records(tmp_path / "records", [seed_rec, good])
    with pytest.raises(DataError, match="not token-exact"):
        build_data(tmp_path / "records", tmp_path / "data", folder, DataConfig(), "m")


def _retokenized_records():
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "smollm2_retokenized.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_real_non_canonical_tokenizations_supervise_the_generated_ids(smol):
    """Recorded from the real server (demo run, 128-token cap): SmolLM2 generated token sequences that re-tokenizing
    its own text does not reproduce (a cut multi-byte character, merges that differ). Same text: the sample carries
    the ids the target generated, flagged, not a mismatch."""
    recs = _retokenized_records()
    assert len(recs) == 4
    for rec in recs:
        gen = rec["turns"][0]["token_ids"]
        canonical = smol.encode([rec["messages"][-1]["content"]])[0]
        assert canonical != gen  # really non-canonical
        (s,) = smol.render(rec)
        sp = s.spans[0]
        assert s.input_ids[sp.start : sp.end] == gen and sum(s.loss_mask[sp.start : sp.end]) == len(gen)
        assert "retokenized" in s.flags and validate_sample(s, smol.tok) == []


def test_different_text_is_still_a_mismatch_after_retokenization_check(smol):
    rec = copy.deepcopy(_retokenized_records()[0])
    ids = rec["turns"][0]["token_ids"]
    ids[5] = ids[5] + 1  # one token of another text
    (s,) = smol.render(rec)
    (mm,) = validate_sample(s, smol.tok)
    assert mm.position == 5 and "retokenized" not in s.flags
