"""Row shapes, deduplication, stable ids and bad input of prompt sources (no server needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from draftsmith.errors import SourceError
from draftsmith.generation.sources import RowError, extract_prompts, prompt_id, row_to_messages

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "row, expected",
    [
        ({"turns": ["Q1", "Q2"]}, [{"role": "user", "content": "Q1"}, {"role": "user", "content": "Q2"}]),
        ({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                       {"role": "assistant", "content": "old answer"}, {"role": "user", "content": "U2"}]},
         [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, {"role": "user", "content": "U2"}]),
        ({"conversations": [{"from": "human", "value": " Hi "}, {"from": "gpt", "value": "Hello"}]},
         [{"role": "user", "content": "Hi"}]),
        ({"question": "2+2?", "answer": "4"}, [{"role": "user", "content": "2+2?"}]),
        ({"instruction": "Translate", "input": "bonjour"}, [{"role": "user", "content": "Translate\n\nbonjour"}]),
        ({"instruction": "Suggest", "instances": [{"input": "", "output": "x"}]}, [{"role": "user", "content": "Suggest"}]),
        ({"instruction": "Fix", "instances": [{"input": "teh cat", "output": "the cat"}]},
         [{"role": "user", "content": "Fix\n\nteh cat"}]),
    ],
)
def test_row_shapes(row, expected):
    assert row_to_messages(row) == expected


@pytest.mark.parametrize(
    "row, reason",
    [([1, 2], "not_an_object"), ({"foo": "bar"}, "unknown_shape"), ({"turns": "not a list"}, "bad_turns"),
     ({"question": "   "}, "empty_prompt"), ({"messages": [{"role": "assistant", "content": "only me"}]}, "empty_prompt")],
)
def test_bad_rows_have_reasons(row, reason):
    with pytest.raises(RowError) as e:
        row_to_messages(row)
    assert e.value.reason == reason


def test_stable_ids_ignore_surrounding_whitespace_but_not_content():
    a = prompt_id([{"role": "user", "content": "Hello"}])
    assert a == prompt_id([{"role": "user", "content": "  Hello\n"}])
    assert a != prompt_id([{"role": "user", "content": "Hello!"}])
    assert a != prompt_id([{"role": "system", "content": "Hello"}])
    assert len(a) == 16 and int(a, 16) >= 0


def test_bundled_pools_and_eval_sets_extract(tmp_path):
    r = extract_prompts(str(REPO / "data/prompts/self_instruct_seed_tasks.jsonl"))
    assert len(r.prompts) == 175 and not r.skipped
    mt = extract_prompts(str(REPO / "data/eval/mt_bench.jsonl"))
    assert len(mt.prompts) == 80 and all(len(p.messages) == 2 for p in mt.prompts)
    g = extract_prompts(str(REPO / "data/prompts/gsm8k_train.jsonl"), limit=10)
    assert len(g.prompts) == 10 and g.prompts[0].row == 0


def test_duplicates_and_malformed_lines_are_counted(tmp_path):
    src = tmp_path / "p.jsonl"
    src.write_text('{"question": "a"}\n{"question": "a "}\nnot json\n{"nope": 1}\n\n{"question": "b"}\n')
    r = extract_prompts(str(src))
    assert [p.messages[0]["content"] for p in r.prompts] == ["a", "b"]
    assert r.duplicates == 1
    assert dict(r.skipped) == {"malformed_json": 1, "unknown_shape": 1}


def test_json_parquet_and_dataset_folder(tmp_path):
    rows = [{"question": f"q{i}"} for i in range(5)]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    assert len(extract_prompts(str(tmp_path / "rows.json")).prompts) == 5
    import datasets

    ds = datasets.Dataset.from_list([{"conversations": [{"from": "human", "value": f"hi {i}"}]} for i in range(4)])
    ds.to_parquet(str(tmp_path / "rows.parquet"))
    assert len(extract_prompts(str(tmp_path / "rows.parquet")).prompts) == 4
    # a local dataset folder stands in for a hub name (the hub is unreachable here)
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "ds"))
    r = extract_prompts(str(tmp_path / "ds"), limit=3)
    assert [p.messages[0]["content"] for p in r.prompts] == ["hi 0", "hi 1", "hi 2"]


def test_unusable_sources_are_clear_errors(tmp_path):
    with pytest.raises(SourceError, match="does not exist"):
        extract_prompts(str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text("nope\n{}\n")
    with pytest.raises(SourceError, match="no usable prompt.*malformed_json=1.*unknown_shape=1"):
        extract_prompts(str(bad))
    with pytest.raises(SourceError, match="unknown file type"):
        (tmp_path / "x.csv").write_text("a,b\n")
        extract_prompts(str(tmp_path / "x.csv"))
