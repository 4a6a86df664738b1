"""The package's import graph: no circle between modules, and the queue package below the stages (it imports none).

Every ``import`` of a ``draftsmith`` module counts, the ones inside functions too (a lazy import still ties two
modules together). The one exemption is the CLI package, where ``draftsmith.cli`` imports its command modules so
that they register on its typer app, and each of them imports that app: typer's own registration pattern.
"""

from __future__ import annotations

import ast
from pathlib import Path

SHARED = Path(__file__).resolve().parents[1] / "shared"


def import_graph() -> dict[str, set[str]]:
    """Module name -> the draftsmith modules it imports (``from a.b import c`` counts ``a.b.c`` when it is a
    module, else ``a.b``)."""
    mods = {}
    for p in (SHARED / "draftsmith").rglob("*.py"):
        name = ".".join(p.relative_to(SHARED).with_suffix("").parts).removesuffix(".__init__")
        mods[name] = p

    def owner(n: str) -> str:
        while n and n not in mods:
            n = n.rpartition(".")[0]
        return n

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        for node in ast.walk(ast.parse(p.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("draftsmith"):
                targets = [owner(f"{node.module}.{a.name}") for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [owner(a.name) for a in node.names if a.name.startswith("draftsmith")]
            graph[m] |= {t for t in targets if t and t != m}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_outside_the_cli_registration():
    graph = import_graph()
    assert len(graph) > 80 and graph["draftsmith.paths"], "the scan found too little: it is broken"
    found = [c for c in cycles(graph) if not all(m == "draftsmith.cli" or m.startswith("draftsmith.cli.") for m in c)]
    assert found == [], found


def test_the_artifacts_do_not_import_the_run_layout():
    """``paths`` composes names from the artifacts' owners; the artifacts write through their own storage layer."""
    graph = import_graph()
    up = {m: sorted(graph[m] & {"draftsmith.paths"}) for m in graph if m.startswith("draftsmith.artifacts")}
    assert not any(up.values()), up


def test_the_queue_package_imports_no_stage():
    """``jobqueue`` runs any stage's jobs; the stages register what they need of it (``jobqueue.hooks``)."""
    graph = import_graph()
    stages = ("generation", "features", "data", "drafter", "evaluation", "target", "cli", "demo")
    up = {m: sorted(t for t in graph[m] if t.removeprefix("draftsmith.").split(".")[0] in stages)
          for m in graph if m.startswith("draftsmith.jobqueue")}
    assert len(up) >= 6 and not any(up.values()), up
