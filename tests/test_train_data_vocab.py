"""`make train` after `make data JOB_ENV='-e DRAFTSMITH_DATA__DRAFT_VOCAB_SIZE=32000'` (docs/gpu-host.md section 9):
the trainer, another container without that variable, takes the run's one draft vocabulary instead of asking for
the default size and refusing; a size set here, or several vocabularies, leave the choice to the settings."""

from __future__ import annotations

from draftsmith.cli.train import with_data_vocab
from draftsmith.config import load_settings


def _run(tmp_path, *sizes: int):
    vocab = tmp_path / "r" / "data" / "vocab"
    vocab.mkdir(parents=True)
    for n in sizes:
        (vocab / f"draft-{n}.safetensors").write_bytes(b"")


def test_the_runs_one_vocabulary_is_taken(tmp_path, capsys):
    _run(tmp_path, 1024)
    s = load_settings(None, {"runs_dir": str(tmp_path), "run": "r"})
    assert s.data.draft_vocab_size == 8192 and with_data_vocab(s).train.draft_vocab_size == 1024
    assert "train.draft_vocab_size 1024: the run's one draft vocabulary" in capsys.readouterr().err


def test_a_size_set_here_or_several_vocabularies_decide_themselves(tmp_path):
    _run(tmp_path, 1024, 2048)
    s = load_settings(None, {"runs_dir": str(tmp_path), "run": "r"})
    assert with_data_vocab(s).train.draft_vocab_size is None  # the trainer names both sizes when it refuses
    for given in ({"data": {"draft_vocab_size": 2048}}, {"train": {"draft_vocab_size": 2048}}):
        s = load_settings(None, {"runs_dir": str(tmp_path / "other"), "run": "r", **given})
        assert with_data_vocab(s) is s
