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


@pytest.fixture
def export_drafter(embedded_target: Path):
    """Factory: ``export_drafter(out, layout, **drafter_config)`` writes a randomly initialised drafter (draft
    vocabulary 64: target ids 0, 3, 6, ...) with draftsmith's own exporter, in the ``eagle3`` or ``speculators``
    layout."""
    import torch
    from draftsmith.drafter.config import derive_config
    from draftsmith.drafter.families.eagle3.export import write_export
    from draftsmith.drafter.families.eagle3.model import Eagle3Drafter

    def make(out: Path, layout: str, **kw) -> Path:
        torch.manual_seed(0)
        m = Eagle3Drafter(derive_config(embedded_target, 64, **kw))
        m.d2t.copy_(torch.arange(64) * 2)  # draft i -> target 3 * i
        m.t2d[torch.arange(64) * 3] = True
        return write_export(m, out, layout, verifier=str(embedded_target))

    return make
