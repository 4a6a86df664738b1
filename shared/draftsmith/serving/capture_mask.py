"""Masking of what looks like a secret or personal data in captured traffic, before anything is written.

Each built-in kind is a regular expression (cards are also Luhn-checked, so an ordinary long number stays); a match
becomes ``[KIND]`` (``[EMAIL]``, ``[API_KEY]``, ...), and the user's own expressions (``capture.mask_regex``) become
``[MASKED]``. The patterns are deliberately narrow where a false positive would damage training text (a phone number
needs separators, so arithmetic such as ``12345678`` stays); what they miss is for ``capture.mask_regex``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"

BUILTIN: dict[str, re.Pattern[str]] = {
    # provider key shapes (OpenAI/Anthropic sk-, Stripe pk/rk, AWS, GitHub, Slack, Hugging Face), bearer tokens
    # and PEM private keys
    "api_key": re.compile(
        r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----"
        r"|\b(?:sk|pk|rk)-[A-Za-z0-9_-]{16,}"
        r"|\bAKIA[0-9A-Z]{16}\b"
        r"|\bgh[pousr]_[A-Za-z0-9]{30,}"
        r"|\bxox[abpr]-[A-Za-z0-9-]{10,}"
        r"|\bhf_[A-Za-z0-9]{30,}"
        r"|\bBearer\s+[A-Za-z0-9._~+/-]{16,}=*"
    ),
    "email": re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b"),
    "card": re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])"),
    "phone": re.compile(
        r"(?<![\w+])(?:\+\d{1,3}[\s.-]?)?(?:\(\d{2,4}\)[\s.-]?|\d{2,4}[\s.-])\d{3,4}[\s.-]\d{3,4}(?!\w)"
    ),
    "ip": re.compile(rf"\b{_OCTET}\.{_OCTET}\.{_OCTET}\.{_OCTET}\b"),
}
"""The kinds ``capture.mask`` can name, applied in this order (a key inside an email-like string goes as a key)."""


def luhn_ok(digits: str) -> bool:
    """Whether the digits of ``digits`` (separators ignored) pass the Luhn check that payment card numbers carry."""
    nums = [int(c) for c in digits if c.isdigit()]
    total = 0
    for i, d in enumerate(reversed(nums)):
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


class Masker:
    """Replaces the spans that look like secrets or personal data in a text.

    Args:
        kinds: built-in kinds to apply (keys of :data:`BUILTIN`).
        extra: the user's regular expressions (masked as ``[MASKED]``, counted as kind ``custom``).

    Raises:
        ValueError: an unknown kind, or an expression that does not compile.
    """

    def __init__(self, kinds: Iterable[str], extra: Iterable[str] = ()) -> None:
        unknown = [k for k in kinds if k not in BUILTIN]
        if unknown:
            raise ValueError(f"unknown mask kinds {unknown}; choose from {sorted(BUILTIN)}")
        self.rules: list[tuple[str, re.Pattern[str]]] = [(k, BUILTIN[k]) for k in BUILTIN if k in set(kinds)]
        self.rules += [("custom", re.compile(p)) for p in extra]

    def mask(self, text: str) -> tuple[str, Counter[str]]:
        """``text`` with every match replaced, and how many spans of each kind were replaced."""
        counts: Counter[str] = Counter()
        for kind, pattern in self.rules:
            placeholder = "[MASKED]" if kind == "custom" else f"[{kind.upper()}]"

            def swap(m: re.Match[str], kind: str = kind, placeholder: str = placeholder) -> str:
                if kind == "card" and not luhn_ok(m.group(0)):
                    return m.group(0)
                counts[kind] += 1
                return placeholder

            text = pattern.sub(swap, text)
        return text, counts
