"""What a check reports: findings (cause, estimated acceptance cost, evidence, fix) and which checks ran."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Finding:
    """One cause of lost acceptance.

    Attributes:
        check: the check's name (``export``, ``loss_rows``, ...).
        cause: one line naming what is wrong.
        cost: the share of acceptance it is likely costing, 0..1: measured where the check can (a share of tokens
            that can never be accepted), else the documented estimate of :mod:`draftsmith.doctor` (docs/doctor.md).
        evidence: the numbers and tokens that show it.
        fix: what to do.
    """

    check: str
    cause: str
    cost: float
    evidence: str
    fix: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


@dataclass
class CheckResult:
    """A check's outcome: ``ran`` False with ``note`` saying what it lacked (an input or the server)."""

    check: str
    ran: bool
    findings: list[Finding] = field(default_factory=list)
    note: str = ""
    needs_server: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"check": self.check, "ran": self.ran, "note": self.note, "needs_server": self.needs_server,
                "findings": [f.to_dict() for f in self.findings]}


def skipped(check: str, note: str, needs_server: bool = False) -> CheckResult:
    """A check that could not run, and why."""
    return CheckResult(check, False, [], note, needs_server)


def ranked(results: list[CheckResult]) -> list[Finding]:
    """Every finding of ``results``, the costliest first (ties keep the checks' order)."""
    out = [f for r in results for f in r.findings]
    return sorted(out, key=lambda f: -f.cost)
