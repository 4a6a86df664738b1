"""The runbook of docs/gpu-host.md section 9 as data: its marked blocks, the CPU table beside them, the steps.

The doc marks each block the test runs with an HTML comment before its fenced code (``<!-- runbook:env -->``,
``<!-- runbook:run -->``) and ends it with ``<!-- runbook:end -->``; the table of what a CPU runs instead sits
between ``<!-- runbook:cpu -->`` and ``<!-- runbook:end -->``, one row per replacement: ``as written``, ``on the
CPU stack``, ``why``, the first two as code spans. Replacements are literal text, applied to the blocks only; a row
whose text no block holds is an error (the table would have gone stale), so the commands themselves are never
edited by hand.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "gpu-host.md"
_BLOCK = re.compile(r"<!-- runbook:(\w+) -->\n(.*?)<!-- runbook:end -->\n", re.S)
_FENCE = re.compile(r"```\w*\n(.*?)```\n", re.S)
_SPAN = re.compile(r"`([^`]+)`")
# a comment line of the run block that edits .env: "# DRAFTER_DIR=/runs/kimi/export/eagle3 in .env, then:"
_ENV_EDIT = re.compile(r"\b([A-Z][A-Z0-9_]*)=(\S+) in \.env\b")


@dataclass(frozen=True)
class Row:
    """One row of the CPU table: the text as written, what the CPU stack runs instead, and why."""

    written: str
    cpu: str
    why: str


@dataclass(frozen=True)
class Step:
    """One step of the run block: a shell command (``command``), or a ``.env`` edit (``env_key``, ``env_value``)."""

    command: str | None = None
    env_key: str | None = None
    env_value: str | None = None


def marked(doc: str) -> dict[str, str]:
    """``{name: text}`` of every marked section of ``doc``: the fenced code of ``env`` and ``run``, the raw text of
    ``cpu`` (the table).

    Raises:
        ValueError: a block named twice, or a code block without exactly one fenced block.
    """
    out: dict[str, str] = {}
    for m in _BLOCK.finditer(doc):
        name, body = m.group(1), m.group(2)
        if name in out:
            raise ValueError(f"runbook block {name!r} marked twice in {DOC.name}")
        if name == "cpu":
            out[name] = body
            continue
        fences = _FENCE.findall(body)
        if len(fences) != 1:
            raise ValueError(f"runbook block {name!r} holds {len(fences)} fenced blocks, not 1")
        out[name] = fences[0]
    return out


def cpu_table(text: str) -> list[Row]:
    """The rows of the CPU table (header and separator skipped).

    Raises:
        ValueError: a row whose first two cells are not code spans.
    """
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] in ("as written", "---"):
            continue
        spans = [_SPAN.fullmatch(c) for c in cells[:2]]
        if not all(spans):
            raise ValueError(f"CPU table row without code spans in its first two cells: {line!r}")
        rows.append(Row(spans[0].group(1), spans[1].group(1), " | ".join(cells[2:])))
    return rows


def substitute(blocks: dict[str, str], rows: list[Row], fill: dict[str, str]) -> dict[str, str]:
    """The code blocks with every row's text replaced (every occurrence, in every block); ``{name}`` in a
    replacement is filled from ``fill``.

    Raises:
        ValueError: a row whose text occurs in no block, or a placeholder ``fill`` lacks.
    """
    out = {k: v for k, v in blocks.items() if k != "cpu"}
    for row in rows:
        if not any(row.written in v for v in out.values()):
            raise ValueError(f"the CPU table replaces {row.written!r}, which no runbook block holds")
        try:
            cpu = row.cpu.format(**fill)
        except KeyError as e:
            raise ValueError(f"the CPU table's {row.cpu!r} names {e}, which the test does not fill") from e
        out = {k: v.replace(row.written, cpu) for k, v in out.items()}
    return out


def env_lines(text: str) -> list[tuple[str, str]]:
    """``(key, line)`` for each assignment of the env block, the line as written (its comment kept: Compose and
    the Makefile read it past the value)."""
    out = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            out.append((line.partition("=")[0].strip(), line))
    return out


def steps(text: str) -> list[Step]:
    """The run block as steps: each command line, and each comment line that edits ``.env`` (``KEY=VALUE in
    .env``); other comment lines (what to expect, what to wait for) carry no step."""
    out = []
    for line in text.splitlines():
        s = line.strip()
        if not s:
            continue
        if s.startswith("#"):
            m = _ENV_EDIT.search(s)
            if m:
                out.append(Step(env_key=m.group(1), env_value=m.group(2)))
            continue
        out.append(Step(command=s))
    return out


def runbook(
    fill: dict[str, str], doc: str | None = None
) -> tuple[list[tuple[str, str]], list[Step], list[Row]]:
    """Section 9 as the CPU stack runs it: its ``.env`` lines, its steps, and the table that changed them."""
    blocks = marked(doc if doc is not None else DOC.read_text())
    rows = cpu_table(blocks["cpu"])
    done = substitute(blocks, rows, fill)
    return env_lines(done["env"]), steps(done["run"]), rows
