"""How ``torchrun`` is started for training: one node (``--standalone``) or several (a c10d rendezvous).

On one node torchrun's ``--standalone`` runs its own rendezvous on a free local port. Across nodes every node runs
the same command with ``--nnodes N --rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id <run>``: the first to
arrive hosts the rendezvous store at the endpoint (a node's address every node reaches), and ranks are given out as
nodes join (PyTorch's elastic launch docs). Settings: ``train.nnodes`` and ``train.rdzv_endpoint``.
"""

from __future__ import annotations

import sys

from draftsmith.errors import ConfigError


def rendezvous_args(nnodes: int, rdzv_endpoint: str | None, run_id: str) -> list[str]:
    """torchrun's rendezvous flags: ``["--standalone"]`` for one node, else the c10d flags.

    Raises:
        ConfigError: several nodes and no ``train.rdzv_endpoint`` (the message says what to set).
    """
    if nnodes <= 1:
        return ["--standalone"]
    if not rdzv_endpoint:
        raise ConfigError(f"train.nnodes is {nnodes} but train.rdzv_endpoint is not set",
                          "set DRAFTSMITH_TRAIN__RDZV_ENDPOINT=<host>:<port> on every node (an address of one of "
                          "the nodes that all of them reach, e.g. node0:29400)")
    return ["--nnodes", str(nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint,
            "--rdzv-id", run_id]


def torchrun_argv(nnodes: int, rdzv_endpoint: str | None, run_id: str, nproc_per_node: int,
                  script: list[str] | None = None) -> list[str]:
    """The whole command: this interpreter's ``torch.distributed.run`` (torchrun) with the rendezvous flags,
    ``--nproc_per_node`` and the script (default ``-m draftsmith train``; the run travels as ``DRAFTSMITH_RUN``,
    since torchrun's parser would take ``--run`` for its own ``--run-path``)."""
    return [sys.executable, "-m", "torch.distributed.run", *rendezvous_args(nnodes, rdzv_endpoint, run_id),
            "--nproc_per_node", str(nproc_per_node), *(script or ["-m", "draftsmith", "train"])]
