"""torchrun on CPU (gloo), two processes: DDP ranks end a step with identical weights; FSDP (sharded weights,
gradients and AdamW state) trains to the same weights as DDP, writes whole tensors to its checkpoints, and an
interrupted FSDP run resumes exactly."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file


def torchrun(runs: Path, run: str, target: Path, vocab: int, out: Path, parallel: str, max_steps: int,
             stop_at: int | None = None, env: dict[str, str] | None = None) -> tuple[dict, dict, dict[str, torch.Tensor]]:
    """Two ranks of tests/drafter/ddp_worker.py; returns (rank0.json, rank1.json, rank 0's whole weights)."""
    from draftsmith.target.server import free_port

    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(Path(__file__).with_name("ddp_worker.py")), str(runs), run, str(target), str(vocab), str(out),
           parallel, str(max_steps)] + ([str(stop_at)] if stop_at else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1))
    return r0, r1, load_file(str(out / "weights.safetensors"))


@pytest.fixture(scope="module")
def runs(reference_run, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dist") / "runs"
    for name in ("ddp", "ddp-2nodes", "fsdp", "fsdp-resumed", "nan"):
        shutil.copytree(reference_run, root / name)
    return root


@pytest.fixture(scope="module")
def ddp_two_steps(runs, embedded_target, draft_vocab, tmp_path_factory):
    return torchrun(runs, "ddp", embedded_target, draft_vocab, tmp_path_factory.mktemp("ddp"), "ddp", 2)


@pytest.mark.slow
def test_two_ranks_agree_after_a_step(runs, ddp_two_steps):
    r0, r1, w = ddp_two_steps
    assert r0["world"] == r1["world"] == 2 and not r0["sharded"]
    assert r0["before"] == r1["before"]  # same seed, same init
    assert r0["after"] == r1["after"]  # different micro-batches, gradients all-reduced
    assert r0["after"] != r0["before"] and r0["step"] == 2  # and steps were taken
    ckpt = load_file(str(runs / "ddp" / "checkpoints" / "step-00000002" / "model.safetensors"))
    assert ckpt.keys() == w.keys() and all(torch.equal(ckpt[k], w[k]) for k in w)


@pytest.mark.slow
def test_fsdp_trains_like_ddp_and_resumes_exactly(runs, ddp_two_steps, embedded_target, draft_vocab, tmp_path):
    _, _, ddp_w = ddp_two_steps
    f0, f1, fsdp_w = torchrun(runs, "fsdp", embedded_target, draft_vocab, tmp_path / "f", "fsdp", 2)
    assert f0["sharded"] and f1["sharded"] and f0["step"] == f1["step"] == 2
    assert fsdp_w.keys() == ddp_w.keys()
    for k in ddp_w:  # reduce-scatter vs all-reduce: same sums, possibly another order
        torch.testing.assert_close(fsdp_w[k], ddp_w[k], rtol=1e-5, atol=1e-6, msg=k)
    ckpt = load_file(str(runs / "fsdp" / "checkpoints" / "step-00000002" / "model.safetensors"))
    for k in fsdp_w:  # whole tensors, not one rank's shard
        assert ckpt[k].shape == fsdp_w[k].shape and torch.equal(ckpt[k], fsdp_w[k]), k

    torchrun(runs, "fsdp-resumed", embedded_target, draft_vocab, tmp_path / "a", "fsdp", 2, stop_at=1)
    r0, _, resumed_w = torchrun(runs, "fsdp-resumed", embedded_target, draft_vocab, tmp_path / "b", "fsdp", 2)
    assert r0["start_step"] == 1 and r0["step"] == 2
    for k in fsdp_w:
        torch.testing.assert_close(resumed_w[k], fsdp_w[k], rtol=1e-6, atol=1e-7, msg=k)


@pytest.mark.slow
def test_nan_features_on_one_rank_are_skipped_without_hanging_the_other(runs, embedded_target, draft_vocab, tmp_path):
    """Failure mode 10 under FSDP: rank 1 skips a micro-batch (NaN features) and runs a stand-in with zero loss
    weight, so rank 0's gathers and reduce-scatters still find a partner (without it torchrun would hang)."""
    r0, r1, w = torchrun(runs, "nan", embedded_target, draft_vocab, tmp_path, "fsdp", 2, env={"POISON_RANK": "1"})
    assert r0["step"] == r1["step"] == 2
    assert r1["nan_feature_samples"] >= 1 and r0["nan_feature_samples"] == 0
    assert all(bool(torch.isfinite(v.float()).all()) for v in w.values())


@pytest.mark.slow
def test_two_nodes_by_c10d_rendezvous_train_like_one_node(runs, ddp_two_steps, embedded_target, draft_vocab, tmp_path):
    """Two "nodes" (own mount and pid namespaces, one rank each) meet at a c10d rendezvous as `draftsmith
    train-launch` starts them (train.nnodes 2, train.rdzv_endpoint) and train exactly as two ranks on one node."""
    from draftsmith.drafter.launch import torchrun_argv
    from draftsmith.target.server import free_port

    out = tmp_path / "out"
    out.mkdir()
    script = [str(Path(__file__).with_name("ddp_worker.py")), str(runs), "ddp-2nodes", str(embedded_target),
              str(draft_vocab), str(out), "ddp", "2"]
    argv = torchrun_argv(2, f"127.0.0.1:{free_port()}", "ddp-2nodes", 1, script)
    assert "--standalone" not in argv and argv[argv.index("--nnodes") + 1] == "2"
    # torch's rendezvous names a node by host name and pid: two namespaces with the same host name must not give
    # torchrun the same pid (two real hosts differ by name), so the second node spends two pids first
    cmds = [shlex.join(argv), "(true); (true); " + shlex.join(argv)]
    nodes = [subprocess.Popen(["unshare", "--kill-child", "-m", "-p", "-f", "--mount-proc", "sh", "-c", cmd],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for cmd in cmds]
    try:
        logs = [n.communicate(timeout=300)[0] for n in nodes]
    finally:
        for n in nodes:
            n.kill()
    assert all(n.returncode == 0 for n in nodes), "\n".join(log[-2000:] for log in logs)
    r0, r1 = (json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["world"] == r1["world"] == 2 and r0["after"] == r1["after"]
    _, _, one_node = ddp_two_steps
    two_nodes = load_file(str(out / "weights.safetensors"))
    assert two_nodes.keys() == one_node.keys() and all(torch.equal(two_nodes[k], one_node[k]) for k in one_node)
