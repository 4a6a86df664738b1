"""Run every check, cheapest first, and rank the findings; print them (rich) and write the JSON report."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from draftsmith.doctor import coverage, data_size, export, gap, loss_rows, serving, template, traffic
from draftsmith.doctor.finding import CheckResult, ranked
from draftsmith.doctor.run import RunView

REPORT_SCHEMA = "draftsmith.doctor/1"


def diagnose(run: RunView, url: str | None = None) -> list[CheckResult]:
    """Every check's result, in the order they ran (cheapest first; the live server last).

    Raises:
        DoctorInputError: an unreadable export or eval report.
        TargetUnavailable: ``url`` given and the server does not answer.
    """
    results = [export.check(run), loss_rows.check(run), coverage.check(run), serving.context(run, url),
               serving.temperature(run), gap.check(run), traffic.check(run), data_size.check(run)]
    return results + template.check(run, url)


def export_versions(run: RunView) -> list[dict[str, Any]]:
    """Each export checked, with the ``code_version`` its config records (None: a peer's export, or an older
    draftsmith's): ``[{"folder", "layout", "code_version"}]``.

    Raises:
        DoctorInputError: an unreadable export (as :attr:`RunView.exports`).
    """
    return [{"folder": str(d), "layout": layout, "code_version": config.get("code_version")}
            for d, layout, config, _ in run.exports]


def report(run: RunView, results: list[CheckResult], seconds: float) -> dict[str, Any]:
    """The JSON report: ranked findings, and per check whether it ran and what it lacked."""
    return {"schema": REPORT_SCHEMA, "run": str(run.root), "seconds": round(seconds, 2),
            "exports": export_versions(run),
            "findings": [f.to_dict() for f in ranked(results)], "checks": [r.to_dict() for r in results],
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def print_report(results: list[CheckResult], console=None, exports: list[dict[str, Any]] | None = None) -> None:
    """Which build made each export (``exports``: :func:`export_versions`), the ranked findings as a rich table,
    then the checks that did not run and why."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    for e in exports or []:
        made = (f"exported by {e['code_version']}" if e["code_version"]
                else "records no code_version (which build made it is unknown)")
        console.print(Text(f"drafter {e['folder']} ({e['layout']}): {made}"))
    findings = ranked(results)
    if findings:
        table = Table(title="why acceptance is low, costliest first", show_lines=True)
        for col in ("#", "check", "est. cost", "cause", "evidence", "fix"):
            table.add_column(col, overflow="fold")
        for i, f in enumerate(findings, 1):
            # Text: tokens and lists in the evidence ("[/INST]") are not rich markup
            table.add_row(str(i), f.check, f"{f.cost:.0%}", Text(f.cause), Text(f.evidence), Text(f.fix))
        console.print(table)
    else:
        console.print("no cause of lost acceptance found by the checks that ran")

    def names(ran: bool, server: bool) -> str:
        return ", ".join(r.check for r in results if r.ran == ran and r.needs_server == server) or "none"

    # which figures came from the run alone and which needed the live server
    console.print(f"ran without a server: {names(True, False)}; ran against the server: {names(True, True)}; "
                  f"not run for want of a server (--url): {names(False, True)}")
    for r in results:
        if not r.ran:
            console.print(f"[dim]not checked: {r.check}: {escape(r.note)}[/]")
        elif r.note:
            console.print(f"[dim]{r.check}: {escape(r.note)}[/]")


def write_json(path: Path, rep: dict[str, Any]) -> None:
    """Write the JSON report (indent 2)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(rep, indent=2) + "\n")
