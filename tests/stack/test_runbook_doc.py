"""docs/gpu-host.md section 9 as the runbook test reads it: the marked blocks, the CPU table, the steps.

No containers: the parsing and the substitution table only (the run itself is tests/stack/test_runbook.py), and the
Makefile reading the runbook's `.env` lines, inline comments included, as Compose does.
"""

from __future__ import annotations

import subprocess

import pytest
from runbook import DOC, Row, cpu_table, marked, runbook, steps, substitute
from stack_helpers import REPO

FILL = {"compose": "docker-compose -p dsrunbook --env-file /x/.env -f compose.yaml"}


def test_the_marked_blocks_and_the_table_are_found():
    blocks = marked(DOC.read_text())
    assert set(blocks) == {"env", "run", "cpu"}
    assert blocks["env"].startswith("TARGET_MODEL=Kimi-K2.5\n") and "EXTRACT_BACKEND=vllm" in blocks["env"]
    assert blocks["run"].startswith("make up\nmake enqueue RUN=kimi ")
    rows = cpu_table(blocks["cpu"])
    assert len(rows) == 17 and all(r.why for r in rows)
    assert Row("EXTRACT_GPUS=8", "EXTRACT_GPUS=2", rows[5].why) == rows[5]


def test_the_cpu_stack_runs_the_commands_as_written_but_for_the_table():
    env, run, rows = runbook(FILL)
    values = {k: line.partition("=")[2].split(" #")[0].strip() for k, line in env}
    assert values["ENGINE"] == "cpu" and values["EXTRACT_BACKEND"] == "vllm" and values["EXTRACT_GPUS"] == "2"
    assert values["TARGET_MODEL"] == "Kimi-K2.5-tiny" and values["TRAIN_GPUS"] == ""
    assert values["TRUST_REMOTE_CODE"] == "1" and values["REASONING_PARSER"] == "kimi_k2"
    # every command the table does not name is the doc's own line, character for character
    written = steps(marked(DOC.read_text())["run"])
    assert len(written) == len(run) == 13
    for before, after in zip(written, run, strict=True):
        if before.command and not any(r.written in before.command for r in rows):
            assert before == after
    commands = [s.command.split("#")[0].strip() for s in run if s.command]
    assert commands[0] == "make up" and commands[-1].startswith("make up && make eval RUN=kimi JOB_ENV=")
    assert commands[4] == f"{FILL['compose']} stop target-cpu"
    assert "DRAFTSMITH_TRAIN__INIT_FROM=/models/Kimi-K2.5-tiny-Eagle3" in commands[7]
    edits = [(s.env_key, s.env_value) for s in run if s.env_key]
    assert edits == [("DRAFTER_DIR", "/runs/kimi/export/eagle3"), ("ENGINE", "vllm")]


def test_a_table_row_that_no_block_holds_is_refused():
    blocks = marked(DOC.read_text())
    with pytest.raises(ValueError, match="which no runbook block holds"):
        substitute(blocks, [Row("EXTRACT_GPUS=16", "EXTRACT_GPUS=2", "stale")], FILL)
    with pytest.raises(ValueError, match="names 'models'"):
        substitute(blocks, [Row("EXTRACT_GPUS=8", "{models}", "unfilled")], FILL)


def test_the_makefile_reads_the_runbooks_env_lines_as_compose_does(tmp_path):
    """`ENGINE=sglang   # the engine ...` is sglang and `TRAIN_GPUS=   # empty: every GPU` is empty (Compose's reading
    of an unquoted value), so that `make train` gets every GPU and `make up` the engine."""
    env = tmp_path / ".env"
    env.write_text("\n".join(line for _, line in runbook(FILL)[0]) + "\nEVAL_ENGINE=vllm  # measured\n")
    mk = tmp_path / "show.mk"
    mk.write_text(
        f"include {REPO}/Makefile\nshow:\n\t@echo '[$(ENGINE)] [$(ENV_TRAIN_GPUS)] [$(EVAL_ENGINE_USED)] "
        "[$(TRAIN_NPROC)]'\n"
    )
    out = subprocess.run(
        ["make", "-s", "-f", str(mk), "show", f"ENV_FILE={env}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert out.stdout.strip().splitlines()[-1] == "[cpu] [] [vllm] [1]", out.stdout + out.stderr
