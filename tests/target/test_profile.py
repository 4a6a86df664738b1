"""Target profiles: what each engine needs, derived from a checkpoint's config files, printed by
``draftsmith target flags`` and applied by the compose serve scripts.

The serve scripts' side is tests/stack/test_compose.py (the real scripts, an argv recorder in place of the engines).
The Kimi-K2.5 config is the published one's shape
(tests/drafter/test_mla_config.py), with its ``auto_map``; the flags are the ones of Kimi's deploy guide.
"""

from __future__ import annotations

import json

import pytest
from draftsmith.cli import app
from draftsmith.target.profile import target_profile
from typer.testing import CliRunner

KIMI_K25 = {
    "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
    "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config",
                 "AutoModel": "modeling_kimi_k25.KimiK25ForConditionalGeneration"},
    "text_config": {"model_type": "kimi_k2", "hidden_size": 7168, "num_hidden_layers": 61, "vocab_size": 163840,
                    "num_attention_heads": 64, "kv_lora_rank": 512},
}
KIMI_TOKENIZER = {"tokenizer_class": "TikTokenTokenizer",
                  "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}}


@pytest.fixture
def kimi(tmp_path):
    folder = tmp_path / "models" / "Kimi-K2.5"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(KIMI_K25))
    (folder / "tokenizer_config.json").write_text(json.dumps(KIMI_TOKENIZER))
    for name in ("tokenization_kimi.py", "modeling_kimi_k25.py", "configuration_kimi_k25.py"):
        (folder / name).write_text("# the checkpoint's own code\n")
    return folder


def test_kimi_k25_profile_gives_each_engine_its_flags(kimi):
    prof = target_profile(kimi)
    assert (prof.family, prof.model_type, prof.trust_remote_code) == ("Kimi-K2.5", "kimi_k25", True)
    assert prof.remote_code_files == ("configuration_kimi_k25.py", "modeling_kimi_k25.py", "tokenization_kimi.py")
    assert prof.engine_args("vllm") == ["--trust-remote-code", "--reasoning-parser", "kimi_k2", "--tool-call-parser",
                                        "kimi_k2", "--mm-encoder-tp-mode", "data"]
    assert prof.engine_args("sglang") == ["--trust-remote-code", "--reasoning-parser", "kimi_k2",
                                          "--tool-call-parser", "kimi_k2"]


def test_embedded_target_needs_nothing_extra(embedded_target):
    prof = target_profile(embedded_target)
    assert prof.family == "Llama" and not prof.trust_remote_code
    assert prof.engine_args("vllm") == [] == prof.engine_args("sglang")
    assert prof.env() == {"TRUST_REMOTE_CODE": "0", "REASONING_PARSER": "", "TOOL_CALL_PARSER": "",
                          "VLLM_EXTRA_ARGS": "", "SGLANG_EXTRA_ARGS": ""}


def test_flags_command_prints_the_env_lines(kimi):
    res = CliRunner().invoke(app, ["target", "flags", "--path", str(kimi)])
    assert res.exit_code == 0, res.output
    lines = [line for line in res.output.splitlines() if not line.startswith("#")]
    assert lines == ["TRUST_REMOTE_CODE=1", "REASONING_PARSER=kimi_k2", "TOOL_CALL_PARSER=kimi_k2",
                     "VLLM_EXTRA_ARGS=--mm-encoder-tp-mode data", "SGLANG_EXTRA_ARGS="]
    assert "tokenization_kimi.py" in res.output and "family Kimi-K2.5" in res.output
    bad = CliRunner().invoke(app, ["target", "flags", "--path", str(kimi.parent)])
    assert bad.exit_code != 0 and "no config.json" in str(bad.exception)
