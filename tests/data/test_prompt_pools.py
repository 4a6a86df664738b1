"""The bundled prompt pools (the demo's data mix): every row of every pool is a usable prompt, the two pools built by
``scripts/make_prompt_pools.py`` are what the script builds, and no training pool holds an eval set's prompt."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from draftsmith.generation.sources import extract_prompts

REPO = Path(__file__).resolve().parents[2]
POOLS = sorted((REPO / "data" / "prompts").glob("*.jsonl"))
EVAL_SETS = sorted((REPO / "shared" / "draftsmith" / "evaluation" / "data").glob("*.jsonl"))


def norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


@pytest.mark.parametrize("pool", POOLS, ids=lambda p: p.name)
def test_every_row_of_a_pool_is_a_prompt(pool):
    rows = sum(1 for line in pool.read_text().splitlines() if line.strip())
    ex = extract_prompts(str(pool))
    assert not ex.skipped, ex.skipped
    assert len(ex.prompts) >= 0.99 * rows  # duplicates are merged, nothing else is lost


def test_multi_turn_pool_has_two_user_turns_and_code_pool_asks_for_code():
    mt = extract_prompts(str(REPO / "data/prompts/multi_turn_followups.jsonl"), 50).prompts
    assert all([m["role"] for m in p.messages] == ["user", "user"] for p in mt)
    code = extract_prompts(str(REPO / "data/prompts/python_stdlib_functions.jsonl"), 50).prompts
    assert all("\ndef " in p.messages[0]["content"] and '"""' in p.messages[0]["content"] for p in code)


def test_no_training_pool_holds_an_eval_prompt():
    assert len(EVAL_SETS) == 4
    # an eval turn without its set's framing line ("Complete the code I provided."), at least 40 characters
    eval_turns = {norm(t.split("\n", 1)[-1] if t.startswith("Complete the code") else t)
                  for f in EVAL_SETS for line in f.read_text().splitlines() if line.strip()
                  for t in json.loads(line)["turns"]}
    eval_turns = {t for t in eval_turns if len(t) >= 40}
    assert len(eval_turns) > 300
    leaks = []
    for pool in POOLS:
        for p in extract_prompts(str(pool)).prompts:
            for m in p.messages:
                text = norm(m["content"])
                leaks += [(pool.name, t[:60]) for t in eval_turns if t in text]
    assert not leaks, leaks[:5]


def test_the_built_pools_are_what_the_script_builds(tmp_path):
    # the script writes next to the bundled pools; rebuild into a copy of data/prompts and compare byte for byte
    # (the code pool is read from this interpreter's standard library: CPython 3.11, as CI's)
    if sys.version_info[:2] != (3, 11):
        pytest.fail(f"the code pool was built from CPython 3.11's standard library, this is {sys.version}")
    copy = tmp_path / "repo"
    (copy / "data" / "prompts").mkdir(parents=True)
    (copy / "scripts").mkdir()
    for name in ("self_instruct_seed_tasks.jsonl", "user_oriented_instructions.jsonl"):
        (copy / "data" / "prompts" / name).write_bytes((REPO / "data" / "prompts" / name).read_bytes())
    (copy / "scripts" / "make_prompt_pools.py").write_bytes((REPO / "scripts" / "make_prompt_pools.py").read_bytes())
    subprocess.run([sys.executable, str(copy / "scripts" / "make_prompt_pools.py")], check=True, capture_output=True)
    for name in ("python_stdlib_functions.jsonl", "multi_turn_followups.jsonl"):
        assert (copy / "data" / "prompts" / name).read_bytes() == (REPO / "data" / "prompts" / name).read_bytes(), name
