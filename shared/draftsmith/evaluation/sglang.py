"""SGLang with an EAGLE-3 drafter: the server command line, and its acceptance figures under one definition.

SGLang reports acceptance two ways (sources: SGLang's ``metrics/collector.py``, PR 3152 for ``spec_verify_ct``,
PR 11441 and 33518 for the per-request fields):

- per request, in ``meta_info`` of ``/generate``: ``completion_tokens`` and ``spec_verify_ct`` (verify passes), and in
  recent versions ``spec_accept_length`` (= completion_tokens / spec_verify_ct), ``spec_accept_rate``,
  ``spec_num_correct_drafts`` / ``spec_accept_token_num`` (accepted draft tokens),
  ``spec_num_proposed_drafts`` / ``spec_draft_token_num`` and ``spec_correct_drafts_histogram`` (h[j] = verify
  passes that accepted exactly j drafts);
- server-wide, with ``--enable-metrics``: gauges ``sglang:spec_accept_length`` and ``sglang:spec_accept_rate`` over
  the most recent batches (not a run total, so only a cross-check).

SGLang's accept length counts the bonus token: completion_tokens = spec_verify_ct + accepted drafts, hence
completion_tokens / spec_verify_ct = 1 + accepted / verify passes, which is vLLM's mean acceptance length
(1 + accepted / drafts). The evaluator sums the per-request counts over a set and applies that formula once.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftsmith.errors import EngineError
from draftsmith.evaluation.prom import parse_text, total
from draftsmith.evaluation.vllm_metrics import Acceptance
from draftsmith.precision import serving_dtype
from draftsmith.target.server import cpu_env

ACCEPTED_KEYS = ("spec_num_correct_drafts", "spec_accept_token_num", "spec_accepted_tokens")
PROPOSED_KEYS = ("spec_num_proposed_drafts", "spec_draft_token_num", "spec_draft_tokens")


@dataclass
class SGLangServerSpec:
    """How to start SGLang with an EAGLE-3 drafter under chain drafting (topk 1, K steps, K+1 draft tokens)."""

    model: Path
    drafter: Path
    k: int = 3
    host: str = "127.0.0.1"
    port: int = 30000
    served_name: str | None = None
    dtype: str = "auto"
    context_length: int | None = None
    mem_fraction_static: float | None = None
    extra_args: tuple[str, ...] = ()
    trust_remote_code: bool = False

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def env(self) -> dict[str, str]:
        """The server's environment (read by the process helper it shares with vLLM, draftsmith.target.server):
        this process's, with the hub turned off as for vLLM."""
        return cpu_env()

    def command(self) -> list[str]:
        """``python -m sglang.launch_server`` with the EAGLE-3 flags and ``--enable-metrics``.

        With ``--speculative-eagle-topk 1`` the draft is a chain and ``--speculative-num-draft-tokens`` must be
        ``num_steps + 1`` (SGLang's server-argument docs); the drafter must be in the EAGLE layout.
        """
        cmd = [
            sys.executable, "-m", "sglang.launch_server",
            "--model-path", str(self.model),
            "--host", self.host, "--port", str(self.port),
            "--dtype", serving_dtype(self.dtype),
            "--speculative-algorithm", "EAGLE3",
            "--speculative-draft-model-path", str(self.drafter),
            "--speculative-num-steps", str(self.k),
            "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(self.k + 1),
            "--enable-metrics",
        ]
        if self.served_name:
            cmd += ["--served-model-name", self.served_name]
        if self.trust_remote_code:
            cmd.append("--trust-remote-code")
        if self.context_length:
            cmd += ["--context-length", str(self.context_length)]
        if self.mem_fraction_static:
            cmd += ["--mem-fraction-static", str(self.mem_fraction_static)]
        return cmd + list(self.extra_args)


def require_sglang() -> None:
    """Raise when SGLang cannot be started on this machine.

    Raises:
        EngineError: the ``sglang`` package is not importable (it needs a GPU build; not on the CPU default).
    """
    import importlib.util

    if importlib.util.find_spec("sglang") is None and shutil.which("sglang") is None:
        raise EngineError(
            "SGLang is not installed on this machine (it needs a GPU)",
            "start SGLang on the GPU host with `draftsmith eval --print-sglang-command` and pass --url",
        )


def _first_int(meta: Mapping[str, Any], keys: Iterable[str]) -> int | None:
    for key in keys:
        if meta.get(key) is not None:
            return int(meta[key])
    return None


@dataclass(frozen=True)
class SGLangRequestSpec:
    """The speculative counts of one finished request, read from its ``meta_info``."""

    completion_tokens: int
    verify_ct: int
    accepted: int
    proposed: int | None
    histogram: tuple[int, ...] | None
    engine_accept_length: float | None

    @classmethod
    def from_meta_info(cls, meta: Mapping[str, Any]) -> SGLangRequestSpec:
        """Parse ``meta_info``; accepted drafts = ``completion_tokens - spec_verify_ct`` when not given explicitly.

        Raises:
            EngineError: ``meta_info`` has no ``spec_verify_ct`` (the server runs without speculative decoding).
        """
        if meta.get("spec_verify_ct") is None:
            raise EngineError(
                "SGLang's meta_info has no spec_verify_ct: the server runs without speculative decoding",
                "start it with --speculative-algorithm EAGLE3 (see `draftsmith eval --print-sglang-command`)",
            )
        completion = int(meta["completion_tokens"])
        verify = int(meta["spec_verify_ct"])
        accepted = _first_int(meta, ACCEPTED_KEYS)
        hist = meta.get("spec_correct_drafts_histogram") or meta.get("spec_accept_histogram")
        own = meta.get("spec_accept_length")
        return cls(
            completion_tokens=completion,
            verify_ct=verify,
            accepted=accepted if accepted is not None else max(completion - verify, 0),
            proposed=_first_int(meta, PROPOSED_KEYS),
            histogram=tuple(int(x) for x in hist) if hist else None,
            engine_accept_length=float(own) if own is not None else (completion / verify if verify else None),
        )


def acceptance_from_meta_infos(metas: Iterable[Mapping[str, Any]], k: int) -> Acceptance:
    """Acceptance over many requests, under the one definition (sums first, then the formula).

    Args:
        metas: ``meta_info`` dicts of finished requests.
        k: speculative steps (draft tokens per verify pass under chain drafting, topk 1).

    Returns:
        :class:`Acceptance`; ``per_position[i]`` = verify passes that accepted more than i drafts / verify passes,
        from the histogram when every request carries one, else empty.
    """
    reqs = [SGLangRequestSpec.from_meta_info(m) for m in metas]
    verify = sum(r.verify_ct for r in reqs)
    accepted = sum(r.accepted for r in reqs)
    if verify <= 0:
        return Acceptance(None, None, [], 0.0, 0.0, float(accepted))
    proposed = sum(r.proposed if r.proposed is not None else r.verify_ct * k for r in reqs)
    per_pos: list[float] = []
    if reqs and all(r.histogram for r in reqs):
        width = max(len(r.histogram or ()) for r in reqs)
        hist = [sum((r.histogram or ())[j] if j < len(r.histogram or ()) else 0 for r in reqs) for j in range(width)]
        per_pos = [sum(hist[j] for j in range(i + 1, width)) / verify for i in range(k)]
    return Acceptance(
        acceptance_rate=accepted / proposed if proposed else None,
        mean_acceptance_length=1.0 + accepted / verify,
        per_position=per_pos,
        drafts=float(verify),
        draft_tokens=float(proposed),
        accepted=float(accepted),
    )


@dataclass(frozen=True)
class SGLangGauges:
    """SGLang's server-wide speculative gauges (averages over recent batches; None when absent)."""

    accept_length: float | None
    accept_rate: float | None
    generation_tokens: float | None


def parse_sglang_metrics(text: str, model: str | None = None) -> SGLangGauges:
    """Read ``sglang:spec_accept_length``, ``sglang:spec_accept_rate`` (averaged over ranks) and
    ``sglang:generation_tokens_total`` (summed) from a ``/metrics`` text."""
    samples = parse_text(text)

    def mean(name: str) -> float | None:
        vals = [s.value for s in samples if s.name == name and (model is None or s.labels.get("model_name") == model)]
        return sum(vals) / len(vals) if vals else None

    return SGLangGauges(
        accept_length=mean("sglang:spec_accept_length"),
        accept_rate=mean("sglang:spec_accept_rate"),
        generation_tokens=total(samples, "sglang:generation_tokens_total", model),
    )
