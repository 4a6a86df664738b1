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


U = {"role": "user", "content": "What is the weather in Paris?"}


@pytest.mark.parametrize(
    "row, expected",
    [
        # OpenAI tool use: assistant tool_calls with content null, a tool result, then a follow-up user turn
        ({"messages": [{"role": "system", "content": "Use tools."}, U,
                       {"role": "assistant", "content": None,
                        "tool_calls": [{"id": "c1", "type": "function",
                                        "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                       {"role": "tool", "tool_call_id": "c1", "content": "18 C, cloudy"},
                       {"role": "assistant", "content": "It is 18 C."},
                       {"role": "user", "content": "And tomorrow?"}]},
         [{"role": "system", "content": "Use tools."}, U, {"role": "user", "content": "And tomorrow?"}]),
        # content as a list of text parts; the developer role is the system prompt
        ({"messages": [{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
                       {"role": "user", "content": [{"type": "text", "text": "Part one."},
                                                    {"type": "text", "text": "Part two."}]}]},
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Part one.\nPart two."}]),
        # ShareGPT conversations stored as a JSON string, with a function call and an observation
        ({"conversations": json.dumps([{"from": "human", "value": "Hi"}, {"from": "function_call", "value": "{}"},
                                       {"from": "observation", "value": "{}"}, {"from": "gpt", "value": "Hello"},
                                       {"from": "human", "value": "Bye"}])},
         [{"role": "user", "content": "Hi"}, {"role": "user", "content": "Bye"}]),
    ],
)
def test_tool_use_and_part_lists_keep_their_user_turns(row, expected):
    assert row_to_messages(row) == expected


@pytest.mark.parametrize(
    "row, reason",
    [({"messages": [{"role": "user", "content": [{"type": "text", "text": "What is in it?"},
                                                 {"type": "image_url", "image_url": {"url": "x.png"}}]}]},
      "non_text_content"),
     ({"conversations": "[{\"from\": \"human\""}, "bad_turns"),
     ({"messages": [{"role": "user", "content": None}]}, "bad_turns")],
)
def test_unusable_message_rows_have_reasons(row, reason):
    with pytest.raises(RowError) as e:
        row_to_messages(row)
    assert e.value.reason == reason


@pytest.mark.parametrize(
    "text",
    ["<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
     "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
     "[INST] Hi [/INST]",
     "<｜User｜>Hi<｜Assistant｜>",
     "<|start|>user<|message|>Hi<|end|>",
     "<start_of_turn>user\nHi<end_of_turn>"],
)
def test_prompts_with_template_markup_are_refused(text):
    for row in ({"prompt": text}, {"messages": [{"role": "user", "content": text}]}):
        with pytest.raises(RowError) as e:
            row_to_messages(row)
        assert e.value.reason == "template_markup"


def test_markup_rows_are_counted_and_plain_mentions_kept(tmp_path):
    src = tmp_path / "p.jsonl"
    rows = [{"prompt": "<|im_start|>user\nHi<|im_end|>"}, {"prompt": "Explain what [INST] means in Llama-2 prompts."},
            {"prompt": "Write an <s> tag example."}, {"prompt": "What does the im_start token do?"}]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = extract_prompts(str(src))
    assert res.skipped == {"template_markup": 2}
    assert [p.messages[0]["content"] for p in res.prompts] == [rows[2]["prompt"], rows[3]["prompt"]]


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


def test_limit_draws_a_seeded_sample_over_the_whole_source(tmp_path):
    """A mixture stored source by source (100 maths rows, then 100 code rows): the first 20 rows are all maths, a
    sample of 20 holds both kinds, the same seed draws the same prompts, in source order."""
    src = tmp_path / "mix.jsonl"
    rows = [{"question": f"What is {i} + {i}?"} for i in range(100)] + \
           [{"question": f"Write a Python function number {i}."} for i in range(100)]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    first = extract_prompts(str(src), 20).prompts
    assert [p.row for p in first] == list(range(20))
    a = extract_prompts(str(src), 20, sample_seed=0)
    assert a.rows_read == 200 and a.unique == 200 and len(a.prompts) == 20
    rows_a = [p.row for p in a.prompts]
    assert rows_a == sorted(rows_a) and len(set(rows_a)) == 20
    code = sum(r >= 100 for r in rows_a)
    assert 4 <= code <= 16, rows_a  # binomial(20, 1/2): outside [4, 16] has probability 0.003 (and the seed is fixed)
    assert [p.id for p in extract_prompts(str(src), 20, sample_seed=0).prompts] == [p.id for p in a.prompts]
    assert [p.row for p in extract_prompts(str(src), 20, sample_seed=1).prompts] != rows_a
    assert len(extract_prompts(str(src), 500, sample_seed=0).prompts) == 200  # a limit above the source: all of it
