"""A target whose tokenizer is its own code over ``tiktoken.model`` (Kimi-K2 and K2.5 ship no ``tokenizer.json``):
``build-data`` refuses it with one line until ``target.trust_remote_code`` is set, then builds; the extraction plan
hashes the same tokenizer files without demanding ``tokenizer.json``; the servers get ``--trust-remote-code``.

The fixture (tests/fixtures/templates/kimi_tiktoken, made by make_fixtures.py) is a real remote-code tokenizer that
transformers loads through ``auto_map``.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
from conftest import TEMPLATES, make_record, write_records
from draftsmith.cli import app
from typer.testing import CliRunner

KIMI = TEMPLATES / "kimi_tiktoken"


@pytest.fixture
def kimi_run(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("DRAFTSMITH_DATA__TOKENIZER", str(KIMI))
    monkeypatch.delenv("DRAFTSMITH_TARGET__TRUST_REMOTE_CODE", raising=False)
    recs = [make_record(f"r{i}", [(f"What is {i} plus 3?", f"It is {i + 3}.", f"{i} + 3 = {i + 3}", None)],
                        model=KIMI.name) for i in range(3)]
    write_records(tmp_path / "runs" / "k1" / "records", recs)
    return tmp_path / "runs" / "k1"


def test_build_data_needs_trust_remote_code_then_builds(kimi_run, monkeypatch):
    assert not (KIMI / "tokenizer.json").exists()
    p = subprocess.run([sys.executable, "-m", "draftsmith", "build-data", "--run", "k1", "--draft-vocab-size", "50"],
                       capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 2, out  # DraftsmithError: one line, exit code 2
    assert "checkpoint's own Python code" in out and "target.trust_remote_code=true" in out, out
    assert "Traceback" not in out and not (kimi_run / "data").exists()
    monkeypatch.setenv("DRAFTSMITH_TARGET__TRUST_REMOTE_CODE", "true")
    res = CliRunner().invoke(app, ["build-data", "--run", "k1", "--draft-vocab-size", "50"])
    assert res.exit_code == 0, res.output
    assert "samples 3" in res.output
    man = json.loads((kimi_run / "data" / "manifest.json").read_text())
    # the hash covers the vocabulary, the tokenizer's code and the chat template
    h = hashlib.sha256()
    for name in ("tiktoken.model", "tokenization_tiny_kimi.py"):
        h.update((KIMI / name).read_bytes())
    h.update((KIMI / "chat_template.jinja").read_text().encode())
    assert man["tokenizer"]["sha256"] == h.hexdigest()
    # extraction's plan computes the same hash from the same folder (no tokenizer.json demanded)
    from draftsmith.features.plan import tokenizer_sha256

    assert tokenizer_sha256(KIMI, None, trust_remote_code=True) == man["tokenizer"]["sha256"]


def test_servers_and_clients_get_trust_remote_code(embedded_target):
    from draftsmith.evaluation.runner import SGLangClient
    from draftsmith.evaluation.sglang import SGLangServerSpec
    from draftsmith.target.server import VLLMServerSpec

    assert "--trust-remote-code" in VLLMServerSpec(model=embedded_target, trust_remote_code=True).command()
    assert "--trust-remote-code" not in VLLMServerSpec(model=embedded_target).command()
    spec = SGLangServerSpec(model=embedded_target, drafter=embedded_target, trust_remote_code=True)
    assert "--trust-remote-code" in spec.command()
    client = SGLangClient("http://127.0.0.1:9", KIMI, trust_remote_code=True)
    assert type(client.tokenizer).__name__ == "TinyKimiTokenizer"
    from draftsmith.errors import ModelError

    with pytest.raises(ModelError, match="trust_remote_code"):
        SGLangClient("http://127.0.0.1:9", KIMI)
