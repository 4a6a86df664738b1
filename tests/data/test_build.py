"""build-data end to end on disk: formats.md §3 layout, policies, bad input (each a clear error or counted skip)."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch
from conftest import TEMPLATES, make_record, write_records
from draftsmith.config import DataConfig
from draftsmith.data.build import build_data
from draftsmith.data.render import load_tokenizer
from draftsmith.errors import DataError
from safetensors.torch import load_file

SMOL = "SmolLM2-135M-Instruct"


def test_layout_matches_formats(tmp_path, embedded_target, smollm2_records):
    write_records(tmp_path / "records", smollm2_records)
    res = build_data(tmp_path / "records", tmp_path / "data", embedded_target, DataConfig(draft_vocab_size=16), SMOL)
    data = tmp_path / "data"
    man = json.loads((data / "manifest.json").read_text())
    assert man["schema"] == "draftsmith.data/1" and man["target_model"] == SMOL and man["max_length"] == 2048
    assert len(man["tokenizer"]["sha256"]) == 64
    (shard,) = man["shards"]
    t = load_file(data / shard["file"])
    assert t["input_ids"].dtype == torch.int32 and t["loss_mask"].dtype == torch.uint8
    assert t["offsets"].dtype == torch.int64 and t["offsets"].tolist()[-1] == t["input_ids"].numel()
    assert shard["sample_ids"] == [r["id"] for r in smollm2_records]
    assert shard["lengths"] == torch.diff(t["offsets"]).tolist()
    st = json.loads((data / "stats.json").read_text())
    assert st == res.stats
    assert st["samples"] == 3 and st["records"] == 3 and st["dropped"] == 0
    # supervised = every generated id of every turn (the length-cut turn has no end-of-turn token)
    assert st["supervised_tokens"] == int(t["loss_mask"].sum()) == sum(
        len(tr["token_ids"]) for r in smollm2_records for tr in r["turns"]
    )
    assert st["turns_checked"] == 4 and st["mismatch_rate"] == 0.0
    assert sum(st["length_histogram"].values()) == 3
    vocab = json.loads((data / "vocab" / "draft-16.json").read_text())
    assert vocab["target_vocab_size"] == 49152 and vocab["size"] == 16 and 0 < vocab["coverage"] <= 1
    assert vocab["data_hash"] == man["data_hash"]


def test_policies_too_long_and_truncated(tmp_path, embedded_target, smollm2_records):
    write_records(tmp_path / "records", smollm2_records)
    cfg = DataConfig(max_length=64, too_long="truncate", max_drop_rate=1.0)
    res = build_data(tmp_path / "records", tmp_path / "d1", embedded_target, cfg, SMOL)
    assert res.stats["truncations"] == 1 and res.stats["samples"] == 3
    assert max(sum(s["lengths"]) for s in res.manifest["shards"]) <= 3 * 64
    res = build_data(tmp_path / "records", tmp_path / "d2", embedded_target,
                     DataConfig(max_length=64, too_long="drop", truncated_answers="drop", max_drop_rate=1.0), SMOL)
    assert res.stats["dropped_by_reason"] == {"too_long": 1, "truncated_answer": 1} and res.stats["samples"] == 1


def test_bad_lines_are_counted_skips(tmp_path, embedded_target, smollm2_records):
    no_assistant = copy.deepcopy(smollm2_records[0])
    no_assistant.update(id="b1", messages=no_assistant["messages"][:1], turns=[])
    error_rec = dict(copy.deepcopy(smollm2_records[0]), id="b2", status="error", turns=[],
                     error={"reason": "context_length", "message": "too long", "turn": 0})
    error_rec["messages"] = error_rec["messages"][:1]  # as the generator writes it: the unanswered user turn last
    lines = [*smollm2_records, "{not json", json.dumps({"schema": "other/9", "id": "x"}), json.dumps(no_assistant),
             json.dumps(error_rec), json.dumps(smollm2_records[0])]
    write_records(tmp_path / "records", lines)
    (tmp_path / "records" / "empty.jsonl").write_text("")
    with pytest.raises(DataError, match=r"5 of 8 records dropped"):
        build_data(tmp_path / "records", tmp_path / "data", embedded_target, DataConfig(), SMOL)
    st = json.loads((tmp_path / "data" / "stats.json").read_text())
    assert st["dropped_by_reason"] == {"duplicate": 1, "malformed_json": 1, "no_assistant_turn": 1,
                                       "record_error:context_length": 1, "unknown_schema": 1}
    assert "failed" in st and not (tmp_path / "data" / "manifest.json").exists()
    res = build_data(tmp_path / "records", tmp_path / "data", embedded_target, DataConfig(max_drop_rate=0.7), SMOL)
    assert res.stats["samples"] == 3


def test_a_lone_byte_token_mid_answer_is_supervised_as_generated(tmp_path, embedded_target, smollm2_records):
    # A byte-level BPE target can sample the first byte of a multi-byte character and then something else (seen in
    # vLLM on the tiny Kimi-K2.5-layout target): the server's text holds U+FFFD where its ids hold that byte, and
    # tokenizing the text gives other ids. The text is the same, so the sample takes the ids the target generated.
    # Built from a real SmolLM2 record with SmolLM2's own tokenizer.
    tok = load_tokenizer(embedded_target)
    lone = tok.convert_tokens_to_ids("\u00e2")  # byte 0xE2 (the first of three bytes of e.g. "\u2014")
    bad = copy.deepcopy(smollm2_records[0])
    ids = bad["turns"][0]["token_ids"]  # [..., "Paris", ".", <|im_end|>]
    bad["turns"][0]["token_ids"] = ids[:3] + [lone] + ids[3:]
    bad["messages"][-1]["content"] = tok.decode(bad["turns"][0]["token_ids"][:-1])
    assert "\ufffd" in bad["messages"][-1]["content"]
    bad["id"] = "lone-byte"
    write_records(tmp_path / "records", [*smollm2_records, bad])
    res = build_data(tmp_path / "records", tmp_path / "data", embedded_target, DataConfig(), SMOL)
    st = res.stats
    assert st["dropped"] == 0 and st["samples"] == 4 and st["mismatch_rate"] == 0.0
    assert st["flagged"]["retokenized"] == 1
    (shard,) = res.manifest["shards"]
    t = load_file(tmp_path / "data" / shard["file"])
    i = shard["sample_ids"].index("lone-byte")
    o = t["offsets"].tolist()
    sample, mask = t["input_ids"][o[i]:o[i + 1]].tolist(), t["loss_mask"][o[i]:o[i + 1]].tolist()
    assert [x for x, m in zip(sample, mask, strict=True) if m] == bad["turns"][0]["token_ids"]


def test_empty_records(tmp_path, embedded_target):
    (tmp_path / "records").mkdir()
    with pytest.raises(DataError, match="holds no record shard"):
        build_data(tmp_path / "records", tmp_path / "data", embedded_target, DataConfig(), SMOL)
    (tmp_path / "records" / "a.jsonl").write_text("\n")
    with pytest.raises(DataError, match="hold no record"):
        build_data(tmp_path / "records", tmp_path / "data", embedded_target, DataConfig(), SMOL)


def test_model_mismatch_is_an_error(tmp_path, embedded_target, smollm2_records):
    write_records(tmp_path / "records", [dict(smollm2_records[0], model="Qwen3-8B")])
    with pytest.raises(DataError, match="generated by 'Qwen3-8B'"):
        build_data(tmp_path / "records", tmp_path / "data", embedded_target, DataConfig(), SMOL)


def test_tokenizer_without_chat_template(tmp_path):
    folder = tmp_path / "tok"
    shutil.copytree(TEMPLATES / "llama3", folder)
    (folder / "chat_template.jinja").unlink()
    with pytest.raises(DataError, match="no chat template"):
        load_tokenizer(folder)


def test_reasoning_model_flags_empty_reasoning(tmp_path):
    folder = TEMPLATES / "kimi"
    recs = [make_record("r1", [("q", "a", "why", None)]), make_record("r2", [("q", "b", None, None)])]
    write_records(tmp_path / "records", recs)
    res = build_data(tmp_path / "records", tmp_path / "data", folder, DataConfig(draft_vocab_size=8), "m")
    assert res.stats["flagged"] == {"empty_reasoning": 1} and res.stats["reasoning_mode"] == "field"
    res = build_data(tmp_path / "records", tmp_path / "d2", folder,
                     DataConfig(require_reasoning=True, max_drop_rate=0.5), "m")
    assert res.stats["dropped_by_reason"] == {"empty_reasoning": 1} and res.stats["samples"] == 1


def test_reasoning_only_turn_is_unclosed():
    from draftsmith.data.build import unclosed_reasoning

    def rec(reasoning, content):
        return {"messages": [{"role": "user", "content": "q"},
                             {"role": "assistant", "content": content, "reasoning": reasoning}]}

    # the target stopped inside <think>: the parser gave everything as reasoning and no answer
    assert unclosed_reasoning(rec("Natalia sold 48/2 = 24 clips.", None))
    assert unclosed_reasoning(rec("Natalia sold 48/2 = 24 clips.", ""))
    assert not unclosed_reasoning(rec("Natalia sold 48/2 = 24 clips.", "The answer is 72."))
    assert not unclosed_reasoning(rec(None, "The answer is 72."))  # no reasoning target


def test_captured_prompts_without_an_answer_do_not_count_towards_the_drop_rate(tmp_path):
    """A refresh builds over the generated records and the captured traffic: prompts the gateway kept without the
    target's answer are counted apart and leave the drop rate to the records that went wrong."""
    from collections import Counter

    from draftsmith.data.build import UNANSWERED, BuildStats

    st = BuildStats(records=10, dropped=Counter({UNANSWERED: 6, "too_long": 1}))
    assert st.drop_rate == pytest.approx(0.25)  # 1 of the 4 answered records
    assert st.failure(DataConfig(max_drop_rate=0.3), tmp_path) is None
    assert str(st.failure(DataConfig(max_drop_rate=0.2), tmp_path)).startswith(
        "1 of 4 records dropped (rate 0.2500 > data.max_drop_rate 0.2; 6 captured prompts without an answer not counted)")
    assert BuildStats(records=3, dropped=Counter({UNANSWERED: 3})).drop_rate == 0.0
