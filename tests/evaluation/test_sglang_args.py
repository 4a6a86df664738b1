"""``eval --print-sglang-command`` for a drafter of an MLA target, parsed by SGLang's own argument definitions.

SGLang cannot run here (it needs a GPU build), so its parser is rebuilt from the ``ServerArgs`` fields transcribed
from its source (``tests/fixtures/evaluation/sglang_server_args.json``, commit named there) the way SGLang builds it:
field ``x_y`` -> ``--x-y``, bools are ``store_true``, ``Optional[T]`` parses as ``T``, choices and aliases as listed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "evaluation" / "sglang_server_args.json"
REPO = Path(__file__).resolve().parents[2]


def sglang_parser() -> tuple[argparse.ArgumentParser, dict]:
    spec = json.loads(FIXTURE.read_text())
    # allow_abbrev=False: our command must spell every flag in full, not lean on prefix matching
    p = argparse.ArgumentParser(prog="sglang.launch_server", exit_on_error=False, allow_abbrev=False)
    types = {"str": str, "int": int, "float": float}
    for name, f in spec["fields"].items():
        flags = ["--" + name.replace("_", "-"), *f.get("aliases", [])]
        if f["type"] == "bool":
            p.add_argument(*flags, dest=name, action="store_true")
        else:
            p.add_argument(*flags, dest=name, type=types[f["type"]], choices=f.get("choices"),
                           required=f.get("required", False))
    return p, spec


def parse(cmd: list[str]):
    assert cmd[1:3] == ["-m", "sglang.launch_server"], cmd
    p, spec = sglang_parser()
    args, unknown = p.parse_known_args(cmd[3:])
    assert unknown == [], f"flags SGLang does not define: {unknown}"
    return args, spec


def test_parser_rejects_what_sglang_rejects():
    p, _ = sglang_parser()
    with pytest.raises(argparse.ArgumentError):
        p.parse_args(["--model-path", "m", "--dtype", "fp32"])  # not one of SGLang's dtype choices
    _, unknown = p.parse_known_args(["--model-path", "m", "--speculative-num-draft", "4"])
    assert unknown == ["--speculative-num-draft", "4"]


@pytest.fixture(scope="module")
def mla_target_and_drafter(tmp_path_factory):
    """A random-weight tiny MLA target (shapes only) and a random drafter exported for it (EAGLE-3 layout)."""
    from draftsmith.drafter.config import derive_config
    from draftsmith.drafter.families.eagle3.export import write_export
    from draftsmith.drafter.families.eagle3.model import Eagle3Drafter
    from draftsmith.target.tiny_mla import make_tiny_mla

    root = tmp_path_factory.mktemp("mla")
    target = make_tiny_mla(root / "cache", Path(__file__).resolve().parents[2] / "data" / "prompts", steps=0)
    model = Eagle3Drafter(derive_config(target, 512))
    model.t2d[:512] = True
    return target, write_export(model, root / "drafter", "eagle3")


def test_print_sglang_command_for_an_mla_drafter_parses(mla_target_and_drafter, tmp_path):
    target, drafter = mla_target_and_drafter
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTSMITH_")}
    env.update(DRAFTSMITH_TARGET__PATH=str(target), DRAFTSMITH_RUNS_DIR=str(tmp_path / "runs"),
               PYTHONPATH=str(REPO / "shared"))
    r = subprocess.run([sys.executable, "-m", "draftsmith", "eval", "--drafter", str(drafter), "--k", "3",
                        "--print-sglang-command"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    cmd = shlex.split(r.stdout.strip().splitlines()[-1])
    args, spec = parse(cmd)
    assert args.model_path == str(target) and args.speculative_draft_model_path == str(drafter)
    assert args.speculative_algorithm == "EAGLE3" and args.speculative_algorithm in spec["speculative_algorithm_builtins"]
    assert (args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens) == (3, 1, 4)
    assert args.enable_metrics is True
    cfg = json.loads((Path(args.speculative_draft_model_path) / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    # SGLang (first id 1 -> +1 rule, see draftsmith.features.layers) reads vLLM-numbered ids as the same tensors
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert cfg["head_dim"] == 32 and cfg["num_attention_heads"] == 4
