"""Token-exact validation: the supervised span of every turn must equal the ids the server says it generated.

This is the check that would have caught the seed's bug (reasoning not wrapped in the model's thinking tokens,
as in SpecForge #296 for Qwen3's thinking templates; ``docs/data.md``): the rendered text then differs from what the target
produced, and the first differing token shows where.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from draftsmith.data.render import Sample

CONTEXT_TOKENS = 12


@dataclass(frozen=True)
class Mismatch:
    """One turn whose rendered span differs from the server's token ids.

    Attributes:
        record_id: prompt id of the record.
        turn: assistant turn index.
        position: first differing position inside the span (0 = first generated token).
        rendered: decoded rendered tokens from ``position`` on (up to ``CONTEXT_TOKENS`` tokens).
        generated: decoded server tokens from ``position`` on (up to ``CONTEXT_TOKENS`` tokens).
        rendered_len, generated_len: lengths of both spans, in tokens.
    """

    record_id: str
    turn: int
    position: int
    rendered: str
    generated: str
    rendered_len: int
    generated_len: int
    side: str = "generated"  # "generated": the turn's ids; "prompt": the prompt ids the server reported

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """One log line: where the spans part and both decoded strings."""
        return (
            f"record {self.record_id} turn {self.turn}: first difference at {self.side} token {self.position} "
            f"(rendered {self.rendered_len} tokens, server {self.generated_len}): rendered {self.rendered!r} "
            f"vs server {self.generated!r}"
        )


def first_difference(a: list[int], b: list[int]) -> int | None:
    """First index where ``a`` and ``b`` differ (a length difference counts at ``min(len)``); None if equal."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return None if len(a) == len(b) else n


def validate_sample(sample: Sample, tok) -> list[Mismatch]:
    """Compare each span of ``sample`` with the server's ids of that turn (turns without ids are not checked), and
    the rendered prompt with the server's ``prompt_token_ids`` where they differed (a different prompt text).

    Args:
        sample: a rendered sample; ``sample.spans[i].expected`` holds the server ids.
        tok: the tokenizer, to decode both sides of a difference.

    Returns:
        The mismatching turns (empty when every checked turn is token-exact).
    """
    out = []
    for span in sample.spans:
        if span.prompt is not None and span.prompt_expected is not None:
            pos = first_difference(span.prompt, span.prompt_expected)
            if pos is not None:
                out.append(Mismatch(sample.record_id, span.turn, pos,
                                    tok.decode(span.prompt[pos : pos + CONTEXT_TOKENS]),
                                    tok.decode(span.prompt_expected[pos : pos + CONTEXT_TOKENS]),
                                    len(span.prompt), len(span.prompt_expected), "prompt"))
        if span.expected is None:
            continue
        got = sample.input_ids[span.start : span.end]  # [n_generated]
        pos = first_difference(got, span.expected)
        if pos is None:
            continue
        out.append(
            Mismatch(
                sample.record_id,
                span.turn,
                pos,
                tok.decode(got[pos : pos + CONTEXT_TOKENS]),
                tok.decode(span.expected[pos : pos + CONTEXT_TOKENS]),
                len(got),
                len(span.expected),
            )
        )
    return out
