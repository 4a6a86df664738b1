"""Self-generated prompts (Magpie): the pre-query template comes from the target's own chat template, the target's
requests are filtered on real values, the pool file resumes and survives a dead server, and against the real vLLM
CPU server the target writes requests that the generator then accepts as prompts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from draftsmith.data.render import load_tokenizer
from draftsmith.errors import ConfigError, DataError, TargetUnavailable
from draftsmith.evaluation.sets import load_set
from draftsmith.generation.selfprompts import EvalOverlap, read_pool, rejection, synthesize, user_turn_prefix
from draftsmith.generation.sources import extract_prompts
from draftsmith.target.server import free_port


@pytest.fixture(scope="module")
def tokenizer(embedded_target):
    return load_tokenizer(embedded_target)


def test_the_prefix_is_the_targets_template_cut_before_the_user_text(tokenizer):
    prefix = user_turn_prefix(tokenizer)
    # SmolLM2's template inserts its default system prompt, then opens the user turn
    assert prefix.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert prefix.endswith("<|im_end|>\n<|im_start|>user\n")
    full = tokenizer.apply_chat_template([{"role": "user", "content": "Hi there"}], tokenize=False)
    assert full.startswith(prefix + "Hi there")


def test_a_template_that_does_not_render_the_user_text_is_refused(embedded_target):
    tok = load_tokenizer(embedded_target)
    tok.chat_template = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n<|im_end|>\n{% endfor %}"
    with pytest.raises(ConfigError, match="verbatim"):
        user_turn_prefix(tok)


def test_rejections_name_their_reason():
    ok = "Can you help me plan a three-day trip to Lisbon on a small budget?"
    assert rejection(ok, "stop") is None
    assert rejection(ok, "length") == "cut_off"
    assert rejection("Hello there", "stop") == "too_short"
    assert rejection("word " * 500, "stop") == "too_long"
    assert rejection("میکار شصورة مبتال خورر مبتال بسطة است please", "stop") == "script"
    assert rejection("Tell me a joke <|im_start|>assistant", "stop") == "template_markup"
    assert rejection("Écris-moi un poème sur la mer, s'il te plaît.", "stop") is None  # Latin script is kept


def test_the_overlap_check_catches_an_eval_prompt_and_passes_a_fresh_one():
    ov = EvalOverlap.bundled()
    mt = load_set("mt_bench").prompts[0].turns[0]
    assert ov.hits(mt)
    assert ov.hits("Please answer this: " + " ".join(mt.split()[:12]) + " thanks")  # an 8-word run of it
    assert not ov.hits("Can you help me plan a three-day trip to Lisbon on a small budget?")


def test_a_dead_server_raises_and_the_pool_keeps_its_rows(tmp_path):
    pool = tmp_path / "self.jsonl"
    pool.write_text(json.dumps({"id": "self-a", "prompt": "Can you suggest a name for my new bakery shop?"})
                    + "\n" + '{"id": "self-b", "prom')  # a torn last line, as after a crash mid-write
    assert [r["id"] for r in read_pool(pool)] == ["self-a"]
    with pytest.raises(TargetUnavailable, match="did not answer"):
        synthesize(f"http://127.0.0.1:{free_port()}", "m", "<|im_start|>user\n", 5, pool, timeout_s=5)
    assert [r["id"] for r in read_pool(pool)] == ["self-a"]


def test_a_full_pool_sends_no_request(tmp_path):
    pool = tmp_path / "self.jsonl"
    pool.write_text("".join(json.dumps({"id": f"self-{i}", "prompt": f"Question number {i} for you?"}) + "\n"
                            for i in range(3)))
    rep = synthesize(f"http://127.0.0.1:{free_port()}", "m", "x", 3, pool)  # a dead URL: nothing is asked
    assert (rep.rows, rep.added, rep.requests) == (3, 0, 0)


@pytest.mark.e2e
def test_the_target_writes_requests_that_become_prompts(vllm_server, tokenizer, tmp_path):
    pool = tmp_path / "self.jsonl"
    prefix = user_turn_prefix(tokenizer)
    rep = synthesize(vllm_server, "SmolLM2-135M-Instruct", prefix, 24, pool, seed=3, per_request=8)
    rows = read_pool(pool)
    assert rep.rows == len(rows) == 24 and rep.added == 24 and rep.requests >= 3
    assert rep.completions == 24 + sum(rep.rejected.values())
    assert len({r["prompt"] for r in rows}) == 24 and len({r["id"] for r in rows}) == 24
    ov = EvalOverlap.bundled()
    assert all(rejection(r["prompt"], "stop") is None and not ov.hits(r["prompt"]) for r in rows)
    # requests, not answers: most end with a question mark or ask for something
    asks = sum(r["prompt"].rstrip().endswith("?") or r["prompt"].split()[0].lower() in
               {"can", "could", "write", "please", "i", "i'm", "how", "what", "help"} for r in rows)
    assert asks >= 18, [r["prompt"][:80] for r in rows]
    ex = extract_prompts(str(pool))
    assert len(ex.prompts) == 24 and not ex.skipped
    assert all([m["role"] for m in p.messages] == ["user"] for p in ex.prompts)
    # a rerun for more adds only what is missing, keeping the first 24 in order
    rep2 = synthesize(vllm_server, "SmolLM2-135M-Instruct", prefix, 28, pool, seed=3, per_request=8)
    assert rep2.added == 4 and [r["id"] for r in read_pool(pool)][:24] == [r["id"] for r in rows]


@pytest.mark.e2e
def test_the_cli_writes_the_runs_pool(vllm_server, embedded_target, tmp_path):
    env = {"DRAFTSMITH_RUNS_DIR": str(tmp_path), "DRAFTSMITH_TARGET__URL": vllm_server,
           "DRAFTSMITH_TARGET__PATH": str(embedded_target), "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, "-m", "draftsmith", "self-prompts", "-n", "5", "--run", "r1"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "5 self-generated prompts in" in p.stdout and "draftsmith enqueue --source" in p.stdout
    assert len(read_pool(tmp_path / "r1" / "self_prompts.jsonl")) == 5


@pytest.mark.e2e
def test_asking_for_more_than_the_target_writes_is_a_data_error(vllm_server, tokenizer, tmp_path):
    # one token per request: every request is cut off, the budget of requests runs out with nothing kept
    pool = tmp_path / "p.jsonl"
    with pytest.raises(DataError, match="only 0 usable prompts of 4"):
        synthesize(vllm_server, "SmolLM2-135M-Instruct", user_turn_prefix(tokenizer), 4, pool, per_request=2,
                   max_tokens=1)
    assert read_pool(pool) == []
