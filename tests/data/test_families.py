"""Every chat-template family renders a reasoning record and a plain record with the mask pinned token by token.

Fixture tokenizers (tests/fixtures/templates/<family>/) reproduce each family's layout; each template says where
its layout comes from. ChatML/SmolLM2 uses the real prepared SmolLM2 tokenizer. ``GEN`` is what the target emits
after the generation prompt, written here from each family's documented format (independent of the template), and
its tokenization plays the server's ``token_ids``.
"""

from __future__ import annotations

import pytest
from conftest import TEMPLATES, make_record
from draftsmith.data.render import ChatRenderer, SampleSkip, end_of_turn_ids, load_tokenizer
from draftsmith.data.validate import validate_sample

Q, A, R = "What is 2+3?", "The answer is 5.", "2 + 3 = 5."

# family: (header the prompt ends with, generated text with reasoning or None if the template has no place for
#          reasoning, generated text of a plain record)
CASES = {
    "smollm2": ("<|im_start|>assistant\n", None, f"{A}<|im_end|>"),
    "llama3": ("<|start_header_id|>assistant<|end_header_id|>\n\n", None, f"{A}<|eot_id|>"),
    "qwen3": ("<|im_start|>assistant\n", f"<think>\n{R}\n</think>\n\n{A}<|im_end|>", f"{A}<|im_end|>"),
    "deepseek": ("<｜Assistant｜>", f"{R}</think>{A}<｜end▁of▁sentence｜>", f"{A}<｜end▁of▁sentence｜>"),
    "kimi": ("<|im_assistant|>assistant<|im_middle|>", f"<think>{R}</think>{A}<|im_end|>",
             f"<think></think>{A}<|im_end|>"),
    # Kimi-K2.5's own tokenizer layout: tiktoken.model and a tokenizer class of the checkpoint's own (remote code)
    "kimi_tiktoken": ("<|im_assistant|>assistant<|im_middle|>", f"<think>{R}</think>{A}<|im_end|>",
                      f"<think></think>{A}<|im_end|>"),
    "gpt_oss": ("<|start|>assistant",
                f"<|channel|>analysis<|message|>{R}<|end|><|start|>assistant<|channel|>final<|message|>{A}<|return|>",
                f"<|channel|>final<|message|>{A}<|return|>"),
}
# the empty thinking boilerplate of a non-thinking prompt belongs to the prompt, never to the supervised span
PLAIN_PROMPT_END = {"qwen3": "<think>\n\n</think>\n\n", "deepseek": "<｜Assistant｜></think>"}
# DeepSeek's thinking prompt opens <think> itself: the target generates from the reasoning on
REASONING_PROMPT_END = {"deepseek": "<｜Assistant｜><think>"}


def _folder(family, embedded_target):
    return embedded_target if family == "smollm2" else TEMPLATES / family


@pytest.fixture(scope="module")
def renderers(embedded_target):
    out = {}
    for fam in CASES:
        tok = load_tokenizer(_folder(fam, embedded_target), trust_remote_code=fam == "kimi_tiktoken")
        out[fam] = ChatRenderer(tok, end_of_turn_ids(tok, _folder(fam, embedded_target)))
    return out


def _check_pinned(r: ChatRenderer, rec: dict, header: str, gen: str, prompt_end: str | None = None):
    tok = r.tok
    expected = tok(gen, add_special_tokens=False)["input_ids"]
    rec["turns"][0]["token_ids"] = expected
    (sample,) = r.render(rec)
    (span,) = sample.spans
    ids, mask = sample.input_ids, sample.loss_mask
    # supervised tokens are exactly the generated ones, in one block
    assert [i for i, m in enumerate(mask) if m] == list(range(span.start, span.end))
    assert ids[span.start : span.end] == expected
    assert tok.decode(ids[span.start : span.end]) == gen
    # the prompt before it is the template's own generation prompt, header included, all unsupervised
    end = prompt_end or header
    assert tok.decode(ids[span.start - len(tok(end, add_special_tokens=False)["input_ids"]) : span.start]) == end
    assert header in tok.decode(ids[: span.start])
    # first answer/reasoning token supervised; last supervised token is the end-of-turn token
    assert mask[span.start] == 1 and mask[span.start - 1] == 0
    assert ids[span.end - 1] in r.eot_ids
    assert all(m == 0 for m in mask[span.end :])
    assert validate_sample(sample, tok) == []
    return sample


@pytest.mark.parametrize("family", list(CASES))
def test_plain_record_mask_pinned(renderers, family):
    header, _, gen = CASES[family]
    rec = make_record("p", [(Q, A, None, None)])
    _check_pinned(renderers[family], rec, header, gen, PLAIN_PROMPT_END.get(family))


@pytest.mark.parametrize("family", list(CASES))
def test_reasoning_record(renderers, family):
    header, gen, _ = CASES[family]
    r = renderers[family]
    rec = make_record("r", [(Q, A, R, None)])
    if gen is None:
        assert r.reasoning_mode == "none"
        with pytest.raises(SampleSkip) as e:
            r.render(rec)
        assert e.value.reason == "template_drops_reasoning"
        return
    assert r.reasoning_mode == "field"
    sample = _check_pinned(r, rec, header, gen, REASONING_PROMPT_END.get(family))
    assert R in r.tok.decode([t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m])


def test_qwen3_first_supervised_token_is_think(renderers):
    r = renderers["qwen3"]
    rec = make_record("r", [(Q, A, R, None)])
    (s,) = r.render(rec)
    first = s.input_ids[s.spans[0].start]
    assert r.tok.convert_ids_to_tokens(first) == "<think>"
    assert r.tok.convert_ids_to_tokens(s.input_ids[s.spans[0].start - 1]) != "<think>"


@pytest.mark.parametrize("family", ["qwen3", "deepseek", "kimi", "kimi_tiktoken", "gpt_oss"])
def test_history_drops_reasoning_so_turns_split(renderers, family):
    """Templates that drop earlier reasoning: turn 2's real prompt is not turn 1's sequence, so two samples."""
    r = renderers[family]
    rec = make_record("m", [(Q, A, R, None), ("And 3+4?", "It is 7.", "3 + 4 = 7.", None)])
    samples = r.render(rec)
    assert len(samples) == 2
    for k, s in enumerate(samples):
        assert [sp.turn for sp in s.spans] == [k]
        sup = r.tok.decode([t for t, m in zip(s.input_ids, s.loss_mask, strict=True) if m])
        assert [R, "3 + 4 = 7."][k] in sup
    # the second sample's context holds turn 1 as the template renders history
    assert "The answer is 5." in r.tok.decode(samples[1].input_ids[: samples[1].spans[0].start])


@pytest.mark.parametrize("family", ["smollm2", "llama3"])
def test_plain_multiturn_merges_into_one_sample(renderers, family):
    r = renderers[family]
    rec = make_record("m", [(Q, A, None, None), ("And 3+4?", "It is 7.", None, None)])
    (s,) = r.render(rec)
    assert len(s.spans) == 2
    sup = [r.tok.decode(s.input_ids[sp.start : sp.end]) for sp in s.spans]
    assert sup[0].startswith(A) and sup[1].startswith("It is 7.")
    assert sum(s.loss_mask) == sum(sp.end - sp.start for sp in s.spans)
    # identical to rendering the whole conversation at once
    conv = [{"role": m["role"], "content": m["content"]} for m in rec["messages"]]
    assert s.input_ids == r.encode([r.tok.apply_chat_template(conv, tokenize=False)])[0]
