"""``draftsmith plan`` sizes the seed's job (Kimi-K2.5's published shapes, 8 x 96 GB, 10,000 prompts with long
reasoning) with no error and the feature-store size, and prints one line per problem for a bad folder. The target
folder holds only config files and the weight index (as ``plan`` needs: no weights)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# moonshotai/Kimi-K2.5 config.json (the fields plan reads), tokenizer_config.json's auto_map and the weight
# index's total size (595 GB of INT4 experts and bf16 rest, as published)
KIMI_K25 = {
    "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
    "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config",
                 "AutoModel": "modeling_kimi_k25.KimiK25ForConditionalGeneration"},
    "text_config": {
        "model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168,
        "intermediate_size": 18432, "num_hidden_layers": 61, "num_attention_heads": 64, "num_key_value_heads": 64,
        "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "v_head_dim": 128, "vocab_size": 163840, "max_position_embeddings": 262144, "rms_norm_eps": 1e-5,
        "rope_theta": 50000.0, "hidden_act": "silu",
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 64.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
    },
}
TOTAL_SIZE = 595_000_000_000


@pytest.fixture
def kimi(tmp_path):
    folder = tmp_path / "Kimi-K2.5"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(KIMI_K25))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}}))
    (folder / "tiktoken.model").write_text("")
    (folder / "tokenization_kimi.py").write_text("# the checkpoint's own tokenizer\n")
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": TOTAL_SIZE}, "weight_map": {}}))
    return folder


def plan(folder, tmp_path, *args, cwd=None, **env):
    """``draftsmith plan`` for ``folder`` (None: the target that .env names) in ``cwd`` (default: an empty folder, so
    that no .env of the checkout is read)."""
    e = {"DRAFTSMITH_RUNS_DIR": str(tmp_path / "runs"), **env}
    import os

    if cwd is None:
        cwd = tmp_path / "cwd"
        cwd.mkdir(exist_ok=True)
    target = ["--target", str(folder)] if folder else []
    base = {k: v for k, v in os.environ.items() if k != "ENV_FILE"}
    p = subprocess.run([sys.executable, "-m", "draftsmith", "plan", *target, "--gpus", "8",
                        "--gpu-memory-gb", "96", "--disk-free-gb", "20000", *args],
                       capture_output=True, text=True, timeout=300, env={**base, **e}, cwd=cwd)
    return p.returncode, p.stdout, p.stderr


LONG_REASONING = {"DRAFTSMITH_TARGET__TRUST_REMOTE_CODE": "true", "DRAFTSMITH_TARGET__MAX_MODEL_LEN": "65536",
                  "DRAFTSMITH_GENERATION__MAX_TOKENS": "32768", "DRAFTSMITH_DATA__MAX_LENGTH": "32768",
                  "DRAFTSMITH_DATA__DRAFT_VOCAB_SIZE": "32000", "DRAFTSMITH_TRAIN__BATCH_TOKENS": "32768",
                  "DRAFTSMITH_GENERATION__CONCURRENCY": "20"}


def test_kimi_k25_on_eight_96gb_gpus_plans_without_error(kimi, tmp_path):
    rc, out, err = plan(kimi, tmp_path, "--prompts", "10000", "--prompt-tokens", "300", "--answer-tokens", "8000",
                        **LONG_REASONING)
    assert rc == 0, out + err
    assert "no problem found" in out and err == ""
    assert "Kimi-K2.5, hidden 7168, 61 layers, vocabulary 163840, MLA" in out
    assert "vllm flags: --trust-remote-code --reasoning-parser kimi_k2 --tool-call-parser kimi_k2" in out
    assert "weights 595 GB: 74.4 GB per GPU at tensor parallel 8" in out
    # 10,000 x 8,300 tokens x 4 x 7168 x 2 bytes = 4,760 GB of features
    assert "= 4760 GB" in out and "57.3 KB per token" in out
    # the drafter has Kimi's shapes: hidden 7168, MLP 18432, 64 heads of 128, draft vocabulary 32000
    line = next(x for x in out.splitlines() if x.startswith("drafter:"))
    assert "draft vocabulary 32000" in line
    # what the trainer holds besides the training state: 163840 x 7168 float32 twice (the frozen embedding, the
    # target's untied head) = 9.4 GB, and DDP's float32 gradient buckets (4 bytes per trained parameter)
    assert "9.4 GB the frozen embedding and the target's output head in float32" in line
    assert "19.1 GB of weights, gradients and AdamW" in line and "4.8 GB DDP gradient buckets" in line
    # the KV cache: 576 x 61 x 2 bytes = 70.3 KB per token in the 12 GB per GPU the weights leave: ~20 sequences
    kv = next(x for x in out.splitlines() if x.startswith("KV cache:"))
    assert "70.3 KB per token" in kv and "20 sequences of 8300" in kv and "5 of 33068" in kv


def in_process(folder, tmp_path, disk_free_gb=20000.0, answer_tokens=8000, **overrides):
    """``plan_job`` as ``draftsmith plan`` calls it, in this process (the CLI itself is run above)."""
    from draftsmith.config import load_settings
    from draftsmith.sizing import Host, Job, plan_job

    s = load_settings(overrides={"runs_dir": str(tmp_path / "runs"), **overrides})
    return plan_job(s, folder, Host(8, 96.0, disk_free_gb), Job(10000, 300, answer_tokens))


def test_defaults_for_kimi_say_what_to_change(kimi, tmp_path):
    problems = in_process(kimi, tmp_path).problems
    assert any("ships its own code" in p and "TRUST_REMOTE_CODE=1" in p for p in problems), problems
    assert any("data.max_length 2048 < a mean sample of 8300" in p for p in problems), problems
    assert len(problems) == len(set(problems))


def test_a_bad_folder_is_one_line_per_problem(kimi, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, out, err = plan(empty, tmp_path)
    assert rc == 2 and err.strip() == f"problem: {empty} has no config.json -> point target.path at the target's " \
                                      "checkpoint folder"
    cfg_only = tmp_path / "cfg"
    cfg_only.mkdir()
    (cfg_only / "config.json").write_text(json.dumps(KIMI_K25))
    long = {"target": {"trust_remote_code": True, "max_model_len": 65536},
            "generation": {"max_tokens": 32768, "concurrency": 20},
            "data": {"max_length": 32768, "draft_vocab_size": 32000}, "train": {"batch_tokens": 32768}}
    problems = in_process(cfg_only, tmp_path, disk_free_gb=100, **long).problems
    assert len(problems) == 3, problems
    assert "no tokenizer files" in problems[0]
    assert "no weight index" in problems[1]
    assert "the features need 5236 GB, 100 GB are free" in problems[2]
    assert in_process(kimi, tmp_path, **long).problems == []


def test_concurrency_over_what_the_kv_cache_holds_is_a_problem(kimi, tmp_path):
    long = {"target": {"trust_remote_code": True, "max_model_len": 65536}, "generation": {"max_tokens": 32768},
            "data": {"max_length": 32768, "draft_vocab_size": 32000}, "train": {"batch_tokens": 32768}}
    problems = in_process(kimi, tmp_path, **long).problems  # generation.concurrency: its default 128
    assert problems == ["generation.concurrency 128 is over the 20 sequences of 8300 tokens the KV cache holds: the "
                        "engine queues the rest and preempts running ones when answers grow -> set "
                        "GENERATOR_CONCURRENCY=20 in .env (generation.concurrency; more GPUs per replica hold more)"]
    # at 16 GPUs the weights leave more room per GPU, and the concurrency that fits grows with it
    from draftsmith.config import load_settings
    from draftsmith.sizing import Host, Job, plan_job

    s = load_settings(overrides={"runs_dir": str(tmp_path / "runs"), **long})
    kv = next(x for x in plan_job(s, kimi, Host(16, 96.0, 1e6), Job(10000, 300, 8000)).lines
              if x.startswith("KV cache:"))
    assert "49.2 GB per GPU" in kv and "84 sequences of 8300" in kv, kv


def test_plan_reads_the_env_file_as_make_does(kimi, tmp_path):
    """The seed's settings where the runbook puts them, in .env (the compose variables and DRAFTSMITH_* lines), the
    target named there too: `draftsmith plan` in that folder finds no problem; the shell's value wins over the file."""
    host = tmp_path / "host"
    host.mkdir()
    (host / ".env").write_text(
        f"TARGET_MODEL=Kimi-K2.5\nMODELS_DIR={kimi.parent}\nTRUST_REMOTE_CODE=1\nMAX_MODEL_LEN=65536\n"
        "EXTRACT_GPUS=8\nGENERATOR_CONCURRENCY=20\nREDIS_PASSWORD=\nDRAFTSMITH_GENERATION__MAX_TOKENS=32768\n"
        "DRAFTSMITH_DATA__MAX_LENGTH=32768\nDRAFTSMITH_DATA__DRAFT_VOCAB_SIZE=32000\n"
        "DRAFTSMITH_TRAIN__BATCH_TOKENS=32768\n")
    args = ("--prompts", "10000", "--prompt-tokens", "300", "--answer-tokens", "8000")
    rc, out, err = plan(None, tmp_path, *args, cwd=host)
    assert rc == 0 and "no problem found" in out, out + err
    assert "settings from .env: DRAFTSMITH_DATA__DRAFT_VOCAB_SIZE, DRAFTSMITH_DATA__MAX_LENGTH" in out
    assert "DRAFTSMITH_TARGET__TRUST_REMOTE_CODE" in out and "Kimi-K2.5, hidden 7168" in out


def test_the_shell_wins_over_the_env_file(tmp_path, monkeypatch):
    from draftsmith.cli.plan import apply_env_file, env_file_variables, models_dir_target

    env = tmp_path / ".env"
    env.write_text("TRUST_REMOTE_CODE=1\nMAX_MODEL_LEN=\nDRAFTSMITH_DATA__MAX_LENGTH=32768\nTARGET_MODEL=K\n"
                   "GRAFANA_PORT=3000\n")
    assert env_file_variables(env) == {"DRAFTSMITH_TARGET__TRUST_REMOTE_CODE": "1",
                                       "DRAFTSMITH_DATA__MAX_LENGTH": "32768"}  # empty and non-config: left out
    monkeypatch.setenv("DRAFTSMITH_DATA__MAX_LENGTH", "2048")
    monkeypatch.delenv("DRAFTSMITH_TARGET__TRUST_REMOTE_CODE", raising=False)
    monkeypatch.delenv("TARGET_MODEL", raising=False)
    monkeypatch.delenv("MODELS_DIR", raising=False)
    assert apply_env_file(env) == {"DRAFTSMITH_TARGET__TRUST_REMOTE_CODE": "1"}
    import os

    assert os.environ["DRAFTSMITH_DATA__MAX_LENGTH"] == "2048"
    assert models_dir_target(env) == tmp_path / "models" / "K"
    assert env_file_variables(tmp_path / "missing.env") == {} and models_dir_target(tmp_path / "missing") is None


def test_the_env_file_variables_are_the_ones_compose_maps():
    import re
    from pathlib import Path

    from draftsmith.cli.plan import COMPOSE_VARIABLES

    repo = Path(__file__).resolve().parents[1]
    compose = (repo / "compose.yaml").read_text() + (repo / "compose.gpu.yaml").read_text()
    flags = {"DRAFTSMITH_GENERATION__CONCURRENCY": "--concurrency"}  # the generator's worker flag, not a variable
    for var, key in COMPOSE_VARIABLES.items():
        if key in flags:
            assert re.search(rf"- {flags[key]}\s*\n\s*- \$\{{{var}\b", compose), (var, key)
        else:
            assert f"{key}: ${{{var}" in compose, (var, key)
