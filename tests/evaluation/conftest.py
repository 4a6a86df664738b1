"""Fixtures of the evaluator tests: recorded engine output and a randomly initialised EAGLE-3 drafter folder."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "evaluation"


def _recorder():
    spec = importlib.util.spec_from_file_location("record_vllm_spec", FIXTURES / "record_vllm_spec.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture
def random_drafter(tmp_path: Path, embedded_target: Path) -> Path:
    """A random EAGLE-3 drafter that fits the embedded target (EAGLE layout, draft vocab 4096, layers 1/14/26)."""
    return _recorder().write_random_drafter(embedded_target, tmp_path / "drafter")


@pytest.fixture
def write_drafter(embedded_target: Path):
    """Factory: ``write_drafter(out, draft_vocab=..., layer_ids=...)`` writes a random drafter folder."""
    mod = _recorder()

    def make(out: Path, **kw) -> Path:
        return mod.write_random_drafter(embedded_target, out, **kw)

    return make
