"""Partial records in the data stage: partial records keep their answered turns, a turn cut inside its reasoning
supervises exactly what was generated (or is dropped under its own reason), reasoning left inline in the content is
rendered as the server rendered it, and the prompt side is checked against the server's ``prompt_token_ids``.

SmolLM2 cases use real vLLM CPU output (``tests/fixtures/data``, ``tests/fixtures/generation``); the reasoning
families use the fixture tokenizers (no reasoning model runs here) with ``GEN`` written from each family's format.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from conftest import TEMPLATES, make_record, write_records
from draftsmith.config import DataConfig
from draftsmith.data.build import build_data
from draftsmith.data.render import ChatRenderer, end_of_turn_ids, load_tokenizer
from draftsmith.data.validate import validate_sample
from draftsmith.errors import DataError

SMOL = "SmolLM2-135M-Instruct"
GEN_FIX = Path(__file__).resolve().parents[1] / "fixtures" / "generation" / "vllm_200_chat_token_ids.json"
Q, A, R = "What is 2+3?", "The answer is 5.", "2 + 3 = 5, since two plus three is five"


def _renderer(family):
    tok = load_tokenizer(TEMPLATES / family)
    return ChatRenderer(tok, end_of_turn_ids(tok, TEMPLATES / family))


def _ids(r, text):
    return r.tok(text, add_special_tokens=False)["input_ids"]


def _supervised(r, s):
    return r.tok.decode([t for t, m in zip(s.input_ids, s.loss_mask, strict=True) if m])


# ---- §4: a multi-turn record whose second turn exceeded the context ---------------------------------------------
def test_partial_record_keeps_its_answered_turn(tmp_path, embedded_target, smollm2_records):
    two = copy.deepcopy(smollm2_records[1])  # real two-turn record
    assert len(two["turns"]) == 2
    partial = dict(two, id="p1", status="error", turns=two["turns"][:1],
                   error={"reason": "context_length", "message": "too long", "turn": 1})
    partial["messages"] = two["messages"][:3]  # user, assistant, the user turn the server refused
    write_records(tmp_path / "records", [smollm2_records[0], partial])
    res = build_data(tmp_path / "records", tmp_path / "data", embedded_target, DataConfig(), SMOL)
    st = res.stats
    assert st["dropped"] == 0 and st["samples"] == 2
    assert st["dropped_turns_by_reason"] == {"record_error:context_length": 1}
    assert st["flagged"]["partial_record"] == 1 and st["turns_checked"] == 2 and st["turns_mismatched"] == 0
    shard = res.manifest["shards"][0]
    assert shard["sample_ids"] == [smollm2_records[0]["id"], "p1"]
    # the kept sample supervises exactly turn 1's generated ids and ends there (no refused user turn)
    from safetensors.torch import load_file

    t = load_file(str(tmp_path / "data" / shard["file"]))
    a, b = t["offsets"][1].item(), t["offsets"][2].item()
    ids, mask = t["input_ids"][a:b].tolist(), t["loss_mask"][a:b].tolist()
    assert [i for i, m in zip(ids, mask, strict=True) if m] == two["turns"][0]["token_ids"]
    assert two["messages"][2]["content"] not in load_tokenizer(embedded_target).decode(ids)


def test_error_on_the_first_turn_still_drops_the_record(tmp_path, embedded_target, smollm2_records):
    rec = dict(copy.deepcopy(smollm2_records[0]), id="e1", status="error", turns=[],
               error={"reason": "context_length", "message": "too long", "turn": 0})
    rec["messages"] = rec["messages"][:1]
    write_records(tmp_path / "records", [smollm2_records[0], rec])
    res = build_data(tmp_path / "records", tmp_path / "data", embedded_target, DataConfig(max_drop_rate=0.5), SMOL)
    assert res.stats["dropped_by_reason"] == {"record_error:context_length": 1} and res.stats["samples"] == 1


# ---- §5: reasoning cut by max_tokens before the end of the block ------------------------------------------------
# family: what the target generated before the cut (after the generation prompt)
CUT = {
    "qwen3": f"<think>\n{R}",
    "deepseek": R,  # the thinking prompt opened <think> itself
    "kimi": f"<think>{R}",
    "gpt_oss": f"<|channel|>analysis<|message|>{R}",
}
CLOSERS = {"qwen3": "</think>", "deepseek": "</think>", "kimi": "</think>", "gpt_oss": "<|end|>"}


@pytest.mark.parametrize("family", list(CUT))
def test_cut_reasoning_supervises_exactly_the_generated_ids(family):
    r = _renderer(family)
    gen = _ids(r, CUT[family])
    rec = make_record("c", [(Q, "", R, gen)], finish="length")
    (s,) = r.render(rec)
    (sp,) = s.spans
    assert s.input_ids[sp.start : sp.end] == gen and sum(s.loss_mask) == len(gen)
    assert len(s.input_ids) == sp.end  # nothing the target never saw follows the cut
    assert CLOSERS[family] not in _supervised(r, s) and "cut_reasoning" in s.flags
    assert validate_sample(s, r.tok) == []


def test_cut_reasoning_of_another_text_is_still_a_mismatch():
    r = _renderer("qwen3")
    rec = make_record("c", [(Q, "", R, _ids(r, "<think>\nsomething else entirely"))], finish="length")
    bad = [m for s in r.render(rec) for m in validate_sample(s, r.tok)]
    assert len(bad) == 1 and bad[0].side == "generated"


def test_cut_reasoning_builds_at_zero_mismatch_rate_and_without_ids_drops_the_turn(tmp_path):
    r = _renderer("qwen3")
    ok = make_record("ok", [(Q, A, "2 + 3 = 5.", _ids(r, f"<think>\n2 + 3 = 5.\n</think>\n\n{A}<|im_end|>"))])
    cut = make_record("cut", [(Q, "", R, _ids(r, CUT["qwen3"]))], finish="length")
    no_ids = make_record("noids", [(Q, "", R, None)], finish="length")
    two = make_record("two", [(Q, A, "2 + 3 = 5.", None), ("And 3+4?", "", "3 + 4 is", None)], finish="stop")
    two["turns"][1]["finish_reason"] = "length"
    write_records(tmp_path / "records", [ok, cut, no_ids, two])
    res = build_data(tmp_path / "records", tmp_path / "data", TEMPLATES / "qwen3",
                     DataConfig(max_mismatch_rate=0.0, max_drop_rate=0.5), "m")
    st = res.stats
    assert st["turns_mismatched"] == 0 and st["flagged"]["cut_reasoning"] == 1
    assert st["dropped_by_reason"] == {"truncated_reasoning": 1}  # "noids": its only turn could not be supervised
    assert st["dropped_turns_by_reason"] == {"truncated_reasoning": 1}  # "two" keeps its first turn
    assert res.manifest["shards"][0]["sample_ids"] == ["ok", "cut", "two"]


# ---- §5: reasoning inline in the content (a server without a reasoning parser) -----------------------------------
INLINE = {  # family: (content as the server returned it, generated text)
    "qwen3": (f"<think>\n{R}\n</think>\n\n{A}", f"<think>\n{R}\n</think>\n\n{A}<|im_end|>"),
    "deepseek": (f"{R}</think>{A}", f"{R}</think>{A}<｜end▁of▁sentence｜>"),
    "kimi": (f"<think>{R}</think>{A}", f"<think>{R}</think>{A}<|im_end|>"),
}


@pytest.mark.parametrize("family", list(INLINE))
def test_inline_reasoning_is_rendered_as_the_server_rendered_it(family):
    r = _renderer(family)
    content, gen = INLINE[family]
    rec = make_record("i", [(Q, content, None, _ids(r, gen))])
    (s,) = r.render(rec)
    assert validate_sample(s, r.tok) == [] and "inline_reasoning" in s.flags
    assert "empty_reasoning" not in s.flags and _supervised(r, s) == gen


def test_inline_reasoning_builds_instead_of_dropping_every_record(tmp_path):
    r = _renderer("qwen3")
    content, gen = INLINE["qwen3"]
    recs = [make_record(f"i{k}", [(f"{Q} ({k})", content, None, _ids(r, gen))]) for k in range(3)]
    recs.append(make_record("cut", [(Q, f"<think>\n{R}", None, _ids(r, CUT["qwen3"]))], finish="length"))
    write_records(tmp_path / "records", recs)
    st = build_data(tmp_path / "records", tmp_path / "data", TEMPLATES / "qwen3", DataConfig(), "m").stats
    assert st["dropped"] == 0 and st["samples"] == 4 and st["turns_mismatched"] == 0
    assert st["flagged"] == {"cut_reasoning": 1, "inline_reasoning": 4}


def test_template_kwargs_come_from_the_environment(monkeypatch):
    from draftsmith.config import load_settings

    monkeypatch.setenv("DRAFTSMITH_DATA__TEMPLATE_KWARGS", '{"enable_thinking": false}')
    assert load_settings(None, {}).data.template_kwargs == {"enable_thinking": False}
    monkeypatch.delenv("DRAFTSMITH_DATA__TEMPLATE_KWARGS")
    monkeypatch.setenv("DRAFTSMITH_DATA__TEMPLATE_KWARGS__ENABLE_THINKING", "false")
    monkeypatch.setenv("DRAFTSMITH_DATA__TEMPLATE_KWARGS__REASONING_EFFORT", "low")
    assert load_settings(None, {}).data.template_kwargs == {"enable_thinking": False, "reasoning_effort": "low"}


# ---- §5: the prompt side against the server's prompt_token_ids --------------------------------------------------
def _served_record() -> dict:
    """A record of the real vLLM response in fixtures/generation (prompt and generated ids as served)."""
    body = json.loads(GEN_FIX.read_text())
    c = body["choices"][0]
    return {"schema": "draftsmith.record/1", "id": "s1", "status": "ok", "error": None, "model": body["model"],
            "messages": [{"role": "user", "content": "What is the capital of France?"},
                         {"role": "assistant", "content": c["message"]["content"], "reasoning": None}],
            "turns": [{"finish_reason": c["finish_reason"], "usage": body["usage"], "token_ids": c["token_ids"],
                       "prompt_token_ids": body["prompt_token_ids"], "reasoning_field": None, "latency_s": 0.1}],
            "sampling": {}, "job_id": "t", "created_at": "x"}


def test_prompt_ids_of_the_real_server_are_checked(tmp_path, embedded_target):
    good = _served_record()
    other = copy.deepcopy(good)
    other["id"] = "s2"
    other["messages"][0]["content"] = "What is the capital of Spain?"  # not the prompt the server answered
    write_records(tmp_path / "records", [good, other])
    with pytest.raises(DataError, match="1 of 2 prompts differ"):
        build_data(tmp_path / "records", tmp_path / "data", embedded_target, DataConfig(max_drop_rate=0.5), SMOL)
    res = build_data(tmp_path / "records", tmp_path / "data", embedded_target,
                     DataConfig(max_drop_rate=0.5, max_mismatch_rate=0.5), SMOL)
    st = res.stats
    assert st["prompts_checked"] == 2 and st["prompts_mismatched"] == 1 and st["turns_mismatched"] == 0
    assert st["dropped_by_reason"] == {"prompt_mismatch": 1}
    (mm,) = st["mismatches"]
    assert mm["side"] == "prompt" and "Spain" in mm["rendered"] and "France" in mm["generated"]
    # the good record's sample starts with exactly the prompt the server saw
    from safetensors.torch import load_file

    t = load_file(str(tmp_path / "data" / res.manifest["shards"][0]["file"]))
    n = len(good["turns"][0]["prompt_token_ids"])
    assert t["input_ids"][:n].tolist() == good["turns"][0]["prompt_token_ids"]
    assert t["input_ids"][n : n + 8].tolist() == good["turns"][0]["token_ids"]


# ---- a reasoning parser that dropped generated text -----------------------------------------------------------
def test_a_turn_whose_parser_dropped_a_token_is_read_again_from_its_ids(tmp_path):
    """vLLM's kimi_k2 parser consumes a ``</think>`` generated after the reasoning ended: the record's answer lacks
    a token the target generated. build-data reads such a turn again from its ids (and says so) instead of dropping
    it as not token-exact: the ids are what the target generated."""
    r = _renderer("kimi")
    gen = _ids(r, f"<think>{R}</think>It is 5.</think>{A}<|im_end|>")  # what the target generated
    parsed = make_record("k1", [(Q, f"It is 5.{A}", R, gen)], model="kimi")  # the parser's text: no second </think>
    write_records(tmp_path / "records", [parsed])
    res = build_data(tmp_path / "records", tmp_path / "data", TEMPLATES / "kimi", DataConfig(), "kimi")
    st = res.stats
    assert st["samples"] == 1 and st["flagged"].get("reparsed_from_ids") == 1
    assert st["turns_checked"] == 1 and st["turns_mismatched"] == 0 and st["dropped"] == 0
    from safetensors.torch import load_file

    t = load_file(str(tmp_path / "data" / res.manifest["shards"][0]["file"]))
    ids, mask = t["input_ids"].tolist(), t["loss_mask"].tolist()
    assert [i for i, m in zip(ids, mask, strict=True) if m] == gen  # exactly what was generated
    # without the repair, the same record is not token-exact
    write_records(tmp_path / "one", [parsed])
    rec = json.loads((tmp_path / "one" / "job.jsonl").read_text())
    assert any(validate_sample(s, r.tok) for s in r.render(rec))


def test_a_second_think_block_in_the_answer_is_read_again_from_its_ids(tmp_path):
    """A target that opens a second reasoning block inside its answer (the tiny Kimi-K2.5-layout target in vLLM
    did): the kimi_k2 parser keeps that ``<think>`` in the answer's text but consumes the ``</think>`` after it. The
    record's text and the ids agree once both lose their markers, so the turn is read again from its ids."""
    r = _renderer("kimi")
    gen = _ids(r, f"<think>{R}</think>It is<think>maybe 5.</think>{A}<|im_end|>")
    parsed = make_record("k2", [(Q, f"It is<think>maybe 5.{A}", R, gen)], model="kimi")
    write_records(tmp_path / "records", [parsed])
    res = build_data(tmp_path / "records", tmp_path / "data", TEMPLATES / "kimi", DataConfig(), "kimi")
    st = res.stats
    assert st["samples"] == 1 and st["flagged"].get("reparsed_from_ids") == 1 and st["turns_mismatched"] == 0
    from safetensors.torch import load_file

    t = load_file(str(tmp_path / "data" / res.manifest["shards"][0]["file"]))
    ids, mask = t["input_ids"].tolist(), t["loss_mask"].tolist()
    assert [i for i, m in zip(ids, mask, strict=True) if m] == gen
    # an answer whose words differ from its ids (not only in markers) stays a mismatch
    changed = make_record("k3", [(Q, f"It is<think>maybe 6.{A}", R, gen)], model="kimi")
    write_records(tmp_path / "records2", [changed])
    with pytest.raises(DataError, match="not token-exact"):
        build_data(tmp_path / "records2", tmp_path / "data2", TEMPLATES / "kimi", DataConfig(), "kimi")
