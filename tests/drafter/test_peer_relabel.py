"""bench/peer_speculators.py's ``relabel_peer_data``: the peer's data for the other loss rows made from data already
written, on the reference run (real SmolLM2 token ids and loss masks); the hidden states are linked, not recomputed.

The hidden-state files here are stand-ins (one small file): the function never reads them, it links their folder.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ps():
    sys.path.insert(0, str(REPO / "bench"))
    spec = importlib.util.spec_from_file_location("bench_peer_speculators", REPO / "bench" / "peer_speculators.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _written(ps, run: Path, out: Path) -> list[str]:
    """A folder as write_peer_data leaves it, without running the target: its summary, vocabularies, states."""
    from draftsmith.drafter.data import TrainSamples

    ids = sorted(TrainSamples(run / "data").samples)
    (out / "hidden_states").mkdir(parents=True)
    (out / "hidden_states" / "hs_0.safetensors").write_bytes(b"states")
    np.save(out / "d2t-2048.npy", np.arange(4))
    np.save(out / "t2d-2048.npy", np.ones(4, dtype=bool))
    (out / ps.SUMMARY_FILE).write_text(json.dumps({"run": str(run), "sample_ids": ids, "loss_rows": "generated",
                                                   "samples": len(ids)}))
    return ids


def test_all_rows_relabel_links_the_states_and_writes_an_all_ones_mask(ps, reference_run, tmp_path):
    from datasets import load_from_disk
    from draftsmith.drafter.data import TrainSamples

    ids = _written(ps, reference_run, tmp_path / "gen")
    made = ps.relabel_peer_data(tmp_path / "gen", reference_run, tmp_path / "all", all_rows=True)
    samples = TrainSamples(reference_run / "data").samples
    ds = load_from_disk(str(tmp_path / "all")).with_format(None)[:]  # plain lists, column by column
    assert ds["seq_len"] == [int(samples[s].input_ids.numel()) for s in ids]
    assert all(set(m) == {1} for m in ds["loss_mask"]) and made["supervised_tokens"] == sum(ds["seq_len"])
    assert ds["input_ids"] == [samples[s].input_ids.tolist() for s in ids]
    assert (tmp_path / "all" / "hidden_states").resolve() == (tmp_path / "gen" / "hidden_states").resolve()
    assert (tmp_path / "all" / "d2t-2048.npy").is_file() and made["loss_rows"] == "all"
    # back to the run's own mask: prompt rows unsupervised again, and a second relabel replaces the link
    made = ps.relabel_peer_data(tmp_path / "gen", reference_run, tmp_path / "all", all_rows=False)
    ds = load_from_disk(str(tmp_path / "all")).with_format(None)[:]
    assert ds["loss_mask"] == [samples[s].loss_mask.tolist() for s in ids]
    assert made["supervised_tokens"] < sum(ds["seq_len"]) and made["loss_rows"] == "generated"


def test_states_of_another_run_are_refused(ps, reference_run, tmp_path):
    _written(ps, reference_run, tmp_path / "gen")
    summary = json.loads((tmp_path / "gen" / ps.SUMMARY_FILE).read_text())
    (tmp_path / "gen" / ps.SUMMARY_FILE).write_text(json.dumps({**summary, "run": str(tmp_path / "other")}))
    with pytest.raises(ps.PeerError, match="was made from"):
        ps.relabel_peer_data(tmp_path / "gen", reference_run, tmp_path / "all", all_rows=True)
    assert not (tmp_path / "all").exists()
