"""vLLM's speculative-decoding counters and the acceptance figures computed from their deltas.

Counters (vLLM v1, ``vllm/v1/spec_decode/metrics.py``; all ``_total``, one series per engine):
``vllm:spec_decode_num_drafts`` (verify steps that carried a draft), ``vllm:spec_decode_num_draft_tokens`` (draft
tokens proposed, K per draft under chain drafting), ``vllm:spec_decode_num_accepted_tokens`` and
``vllm:spec_decode_num_accepted_tokens_per_pos{position}``. Formulas (the ones vLLM's own Grafana panels use,
``docs/evaluation.md``), applied to the difference of two snapshots:

- acceptance rate            = accepted / draft_tokens                        (0..1)
- mean acceptance length     = 1 + accepted / drafts   (tokens per verify step, bonus token counted; 1..K+1)
- acceptance at position i   = accepted_per_pos[i] / drafts                   (0..1, non-increasing in i)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from draftsmith.errors import EngineError
from draftsmith.evaluation.prom import Sample, by_label, parse_text, total

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"


@dataclass(frozen=True)
class SpecCounters:
    """A snapshot (or a difference of two) of vLLM's spec-decode counters, summed over engines.

    ``per_pos[i]`` counts accepted tokens at draft position i (0-based). ``has_spec`` is False when the server runs
    without a drafter (the counters are absent).
    """

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_pos: tuple[float, ...] = ()
    generation_tokens: float = 0.0
    has_spec: bool = False

    @classmethod
    def from_samples(cls, samples: list[Sample], model: str | None = None) -> SpecCounters:
        """Read the counters from parsed samples (``model`` filters on the ``model_name`` label)."""
        drafts = total(samples, DRAFTS, model)
        pos = by_label(samples, ACCEPTED_PER_POS, "position", model)
        per_pos = tuple(pos[str(i)] for i in range(len(pos))) if pos else ()
        return cls(
            drafts=drafts or 0.0,
            draft_tokens=total(samples, DRAFT_TOKENS, model) or 0.0,
            accepted=total(samples, ACCEPTED, model) or 0.0,
            per_pos=per_pos,
            generation_tokens=total(samples, GENERATION_TOKENS, model) or 0.0,
            has_spec=drafts is not None,
        )

    @classmethod
    def from_text(cls, text: str, model: str | None = None) -> SpecCounters:
        """Parse a ``/metrics`` text (see :meth:`from_samples`)."""
        return cls.from_samples(parse_text(text), model)

    def __sub__(self, before: SpecCounters) -> SpecCounters:
        """``after - before``; a counter that went down means the server restarted mid-measurement.

        Raises:
            EngineError: a counter decreased.
        """
        n = max(len(self.per_pos), len(before.per_pos))
        a = self.per_pos + (0.0,) * (n - len(self.per_pos))
        b = before.per_pos + (0.0,) * (n - len(before.per_pos))
        d = SpecCounters(
            drafts=self.drafts - before.drafts,
            draft_tokens=self.draft_tokens - before.draft_tokens,
            accepted=self.accepted - before.accepted,
            per_pos=tuple(x - y for x, y in zip(a, b, strict=True)),
            generation_tokens=self.generation_tokens - before.generation_tokens,
            has_spec=self.has_spec,
        )
        if min((d.drafts, d.draft_tokens, d.accepted, d.generation_tokens, *d.per_pos), default=0.0) < 0:
            raise EngineError(
                "vLLM's counters went down during the measurement (the server restarted)", "run the evaluation again"
            )
        return d


@dataclass(frozen=True)
class Acceptance:
    """Acceptance figures under draftsmith's one definition (``docs/evaluation.md``).

    ``mean_acceptance_length`` counts the bonus token (tokens emitted per verify step, 1..K+1); ``per_position``
    has K entries. All None when no draft was verified.
    """

    acceptance_rate: float | None
    mean_acceptance_length: float | None
    per_position: list[float] = field(default_factory=list)
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0


def acceptance_from_counters(d: SpecCounters, k: int) -> Acceptance:
    """Acceptance from a counter difference (see the module docstring for the formulas; vLLM's own definitions).

    Args:
        d: ``after - before`` counters.
        k: speculative tokens per step; ``per_position`` is padded or cut to K entries.

    Raises:
        EngineError: the server has no spec-decode counters (it runs without a drafter).
    """
    if not d.has_spec:
        raise EngineError(
            "the vLLM server exposes no vllm:spec_decode_* counters: it runs without a drafter",
            "serve the target with --speculative-config (eagle3) or let `draftsmith eval` start it",
        )
    if d.drafts <= 0:
        return Acceptance(None, None, [], 0.0, d.draft_tokens, d.accepted)
    per_pos = [d.per_pos[i] / d.drafts if i < len(d.per_pos) else 0.0 for i in range(k)]
    return Acceptance(
        acceptance_rate=d.accepted / d.draft_tokens if d.draft_tokens else None,
        mean_acceptance_length=1.0 + d.accepted / d.drafts,
        per_position=per_pos,
        drafts=d.drafts,
        draft_tokens=d.draft_tokens,
        accepted=d.accepted,
    )
