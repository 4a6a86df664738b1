"""Where the target's own tokens lie in a training sample, from the record the sample was built from.

A record's turn ``k`` holds the prompt as the server tokenized it (``prompt_token_ids``) and the ids it generated
(``token_ids``). In a sample built from that record the turn's prompt is a prefix of the sample's ids (samples extend
their turns token for token, data/render.py) and the generated ids follow it; a prefix that differs is a sample the
server never saw (another chat template, thinking rendered otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SampleMatch:
    """A sample against its record.

    Attributes:
        generated: bool ``[T]``, rows whose token the target generated (None when no turn's prompt matched).
        mismatch: ``(position, trained id, served id)`` of the first difference to the record's first turn prompt
            when no turn matched, else None.
    """

    generated: torch.Tensor | None
    mismatch: tuple[int, int, int] | None


def record_of(sample_id: str) -> str:
    """The prompt id of a sample id (``<id>`` or ``<id>#<j>``)."""
    return sample_id.split("#", 1)[0]


def first_difference(a: list[int], b: list[int]) -> int:
    """First index where ``a`` and ``b`` differ (the shorter length when one is a prefix of the other)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def match(ids: torch.Tensor, record: dict) -> SampleMatch | None:
    """Match sample ``ids`` (``[T]``) with ``record``; None when the record carries no prompt ids to match."""
    turns = [t for t in record.get("turns") or [] if t.get("prompt_token_ids") and t.get("token_ids") is not None]
    if not turns:
        return None
    seq = ids.tolist()
    generated = torch.zeros(len(seq), dtype=torch.bool)
    matched = False
    for t in turns:
        p, g = t["prompt_token_ids"], t["token_ids"]
        if seq[: len(p)] == p[: len(seq)]:  # a sample cut inside the prompt still matches what it holds
            generated[len(p): len(p) + len(g)] = True
            matched = True
    if matched:
        return SampleMatch(generated, None)
    p = turns[0]["prompt_token_ids"]
    i = first_difference(seq, p)
    return SampleMatch(None, (i, seq[i] if i < len(seq) else -1, p[i] if i < len(p) else -1))
