"""The package's import graph: no circle between modules, and no import pointing up the package order written in
docs/architecture.md (the queue package below the stages, storage below everything that stores).

Every ``import`` of a ``draftsmith`` module counts, the ones inside functions too (a lazy import still ties two
modules together). The one exemption from the circle check is the CLI package, where ``draftsmith.cli`` imports its
command modules so that they register on its typer app, and each of them imports that app: typer's own
registration pattern.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT / "shared"
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def import_graph(shared: Path = SHARED) -> dict[str, set[str]]:
    """Module name -> the draftsmith modules it imports (``from a.b import c`` counts ``a.b.c`` when it is a
    module, else ``a.b``), read from the sources under ``shared/draftsmith``."""
    mods = {}
    for p in (shared / "draftsmith").rglob("*.py"):
        name = ".".join(p.relative_to(shared).with_suffix("").parts).removesuffix(".__init__")
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


def layers(doc: Path = ARCHITECTURE) -> list[list[str]]:
    """The package order of docs/architecture.md: one list of package names per layer, lowest layer first (the
    backticked names of the second column of each row of the table under the ``layers:`` marker)."""
    text = doc.read_text()
    rows = text[text.index("<!-- layers:"):].split("\n")[1:]
    out = []
    for row in rows:
        if not row.startswith("|"):
            break
        cells = [c.strip() for c in row.strip("|").split("|")]
        if len(cells) >= 2 and (names := re.findall(r"`([\w.]+)`", cells[1])):
            out.append(names)
    return out


def package_of(module: str) -> str:
    """``draftsmith.features.jobs`` -> ``features``; ``draftsmith.sizing`` -> ``sizing``; the root -> ``draftsmith``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def upward_imports(graph: dict[str, set[str]], order: list[list[str]]) -> list[str]:
    """Every import of ``graph`` that points up ``order`` (as :func:`layers` returns it), one line each,
    ``importer -> imported (package rank -> package rank)``; a package ``order`` does not place is reported too.

    A package may import itself, any package of a lower layer and a package listed before it in its own layer.
    """
    rank = {p: i for i, p in enumerate(p for layer in order for p in layer)}
    out = [f"{package_of(m)}: not in the package order (docs/architecture.md)"
           for m in sorted(graph) if package_of(m) not in rank]
    for m in sorted(graph):
        a = package_of(m)
        for t in sorted(graph[m]):
            b = package_of(t)
            if a != b and a in rank and b in rank and rank[b] > rank[a]:
                out.append(f"{m} -> {t} ({a} {rank[a]} -> {b} {rank[b]})")
    return sorted(set(out))


def test_the_package_order_is_written_down_once():
    order = layers()
    names = [p for layer in order for p in layer]
    assert len(order) >= 6 and len(names) == len(set(names)), order
    assert {"errors", "artifacts", "jobqueue", "generation", "features", "drafter", "cli"} <= set(names), names


def test_no_import_points_up_the_package_order():
    """Every package sits in docs/architecture.md's order and imports only what is at or below its place."""
    assert upward_imports(import_graph(), layers()) == []


def test_the_order_check_flags_an_upward_arrow_on_a_synthetic_graph():
    order = [["errors"], ["artifacts"], ["jobqueue"], ["generation", "features"], ["cli"]]
    graph = {"draftsmith.errors": set(), "draftsmith.artifacts.records": {"draftsmith.errors"},
             "draftsmith.jobqueue.queues": {"draftsmith.artifacts.records"},
             "draftsmith.generation.store": {"draftsmith.jobqueue.queues"},
             "draftsmith.features.jobs": {"draftsmith.generation.store"},  # later in its own layer: allowed
             "draftsmith.cli": {"draftsmith.features.jobs"}}
    assert upward_imports(graph, order) == []
    graph["draftsmith.generation.store"].add("draftsmith.features.jobs")  # earlier in the layer -> later
    graph["draftsmith.artifacts.records"].add("draftsmith.cli")
    graph["draftsmith.sizing"] = set()
    assert upward_imports(graph, order) == [
        "draftsmith.artifacts.records -> draftsmith.cli (artifacts 1 -> cli 5)",
        "draftsmith.generation.store -> draftsmith.features.jobs (generation 3 -> features 4)",
        "sizing: not in the package order (docs/architecture.md)"]


def copy_of_the_package(dest: Path) -> Path:
    """The package's sources copied under ``dest`` (``dest/draftsmith``), to plant an import in; returns the copy."""
    for p in (SHARED / "draftsmith").rglob("*.py"):
        dst = dest / p.relative_to(SHARED)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, dst)
    return dest / "draftsmith"


def test_a_planted_upward_import_inside_a_function_fails_the_check(tmp_path):
    """A copy of the package with one lazy import from the storage layer up into a stage, the shape of the arrow
    that once ran from the working copy into generation: the check names it, and only it."""
    staging = copy_of_the_package(tmp_path) / "staging.py"
    staging.write_text(staging.read_text() + "\n\ndef _planted():\n    from draftsmith.generation.store import done_ids"
                       "\n\n    return done_ids\n")
    found = upward_imports(import_graph(tmp_path), layers())
    assert len(found) == 1 and found[0].startswith("draftsmith.staging -> draftsmith.generation.store "), found


# Modules and packages (a package name covers every module under it, so a new module is checked without being
# listed) whose package-internal imports sit at the top unless docs/architecture.md's table allows them inside a
# function: the whole package.
TOP_IMPORTS_CHECKED = ("draftsmith",)
# Modules left out of the check while they are rewritten (none now).
TOP_IMPORTS_PENDING: tuple[str, ...] = ()


def lazy_allowed(doc: Path = ARCHITECTURE) -> list[str]:
    """The imports docs/architecture.md allows inside a function (first column of the table under the
    ``lazy imports:`` marker): library or module names, each covering its submodules."""
    text = doc.read_text()
    out = []
    for row in text[text.index("<!-- lazy imports:"):].split("\n")[1:]:
        if not row.startswith("|"):
            break
        out += re.findall(r"^\|\s*`([\w.]+)`", row)
    return out


def _modules(shared: Path) -> dict[str, Path]:
    return {".".join(p.relative_to(shared).with_suffix("").parts).removesuffix(".__init__"): p
            for p in (shared / "draftsmith").rglob("*.py")}


def _imported_names(node: ast.AST) -> list[str]:
    """Dotted names an import statement loads (``from a import b`` loads ``a.b`` when that is a module, else
    ``a``; the caller resolves which)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return []


def import_sites(tree: ast.Module) -> tuple[list[ast.AST], list[ast.AST]]:
    """``(top, inside)``: the import statements a module runs when it is imported (``if TYPE_CHECKING:`` blocks left
    out: they never run) and those inside a function body."""
    top, inside = [], []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and ast.unparse(child.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                visit(ast.Module(body=child.orelse, type_ignores=[]), in_function)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                (inside if in_function else top).append(child)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return top, inside


def heavy_modules(allowed: list[str], shared: Path = SHARED) -> set[str]:
    """The draftsmith modules that, imported, load a library of ``allowed`` (or are one): their own top-level
    imports reach it directly or through other draftsmith modules' top-level imports (parent packages included)."""
    mods = _modules(shared)
    trees = {m: ast.parse(p.read_text()) for m, p in mods.items()}

    def listed(name: str) -> bool:
        return any(name == a or name.startswith(a + ".") for a in allowed)

    def loads(m: str) -> set[str]:
        out = set()
        for node in import_sites(trees[m])[0]:
            for name in _imported_names(node):
                out.add(name)
                parts = name.split(".")
                out |= {".".join(parts[:i]) for i in range(1, len(parts))}  # importing a.b.c runs a and a.b
        return {n for n in out if n in mods or not n.startswith("draftsmith")}

    heavy: dict[str, bool] = {}

    def is_heavy(m: str, seen: frozenset = frozenset()) -> bool:
        if m not in heavy:
            heavy[m] = listed(m) or any(listed(n) or (n in mods and n not in seen and is_heavy(n, seen | {m}))
                                        for n in loads(m))
        return heavy[m]

    return {m for m in mods if is_heavy(m)}


def checked_modules(checked=TOP_IMPORTS_CHECKED, shared: Path = SHARED) -> list[str]:
    """The modules whose imports must sit at the top: those ``checked`` names, itself or as a package above them
    (so a new module of a checked package is checked without being listed), less :data:`TOP_IMPORTS_PENDING`."""
    return sorted(m for m in _modules(shared) if any(m == c or m.startswith(c + ".") for c in checked)
                  and m not in TOP_IMPORTS_PENDING)


def lazy_import_problems(shared: Path = SHARED, checked=None) -> list[str]:
    """One line per package-internal import inside a function of a ``checked`` module that the table does not
    allow: ``module:line imports name inside a function``; ``checked`` defaults to :func:`checked_modules`."""
    checked = TOP_IMPORTS_CHECKED if checked is None else checked
    allowed = lazy_allowed()
    heavy = heavy_modules(allowed, shared)
    mods = _modules(shared)
    out = []
    for m in checked_modules(checked, shared):
        for node in import_sites(ast.parse(mods[m].read_text()))[1]:
            names = [n for n in _imported_names(node) if n.startswith("draftsmith")]
            if isinstance(node, ast.ImportFrom):  # the module itself, or the submodules it names
                subs = [n for n in names[1:] if n in mods]
                names = subs or names[:1]
            for n in names:
                if n not in heavy:
                    out.append(f"{m}:{node.lineno} imports {n} inside a function")
    return out


def test_the_lazy_import_table_names_the_engines_and_torch():
    allowed = lazy_allowed()
    assert {"torch", "transformers", "vllm", "draftsmith.metrics"} <= set(allowed), allowed
    heavy = heavy_modules(allowed)
    assert {"draftsmith.drafter.families.eagle3.model", "draftsmith.precision", "draftsmith.metrics"} <= heavy
    assert not heavy & {"draftsmith.errors", "draftsmith.paths", "draftsmith.staging", "draftsmith.config"}, heavy


def test_package_imports_sit_at_the_top_of_the_checked_modules():
    """Inside a function only what the table of docs/architecture.md allows, in the modules already moved."""
    checked = checked_modules()
    assert {"draftsmith.drafter.trainer", "draftsmith.drafter.families.dflash.export",
            "draftsmith.evaluation.runner", "draftsmith.cli.train"} <= set(checked), checked
    assert lazy_import_problems() == []


def test_a_planted_light_import_inside_a_function_is_flagged(tmp_path):
    staging = copy_of_the_package(tmp_path) / "staging.py"
    staging.write_text(staging.read_text() + "\n\ndef _planted():\n    from draftsmith.errors import StorageError\n"
                       "    from draftsmith.drafter.families.eagle3 import model\n\n    return StorageError, model\n")
    found = lazy_import_problems(tmp_path, ("draftsmith.staging",))
    assert len(found) == 1 and found[0].endswith("imports draftsmith.errors inside a function"), found


def test_a_new_module_of_a_checked_package_is_checked_without_being_listed(tmp_path):
    new = copy_of_the_package(tmp_path) / "features" / "planted.py"
    new.write_text('"""Planted."""\n\n\ndef _planted():\n    from draftsmith.paths import RunPaths\n\n'
                   "    return RunPaths\n")
    found = lazy_import_problems(tmp_path, ("draftsmith.features",))
    assert found == ["draftsmith.features.planted:5 imports draftsmith.paths inside a function"], found


def test_the_cli_and_its_light_commands_load_no_engine_nor_torch():
    """``draftsmith --help`` and the help of the light commands import the whole CLI (every command module) but
    none of the libraries the lazy-imports table keeps out of start-up; a fresh interpreter, so that nothing
    loaded by another test counts."""
    allowed = [a for a in lazy_allowed() if not a.startswith("draftsmith")] + ["draftsmith.metrics"]
    code = ("import json, sys\nfrom draftsmith.cli import app\n"
            "for args in (['--help'], ['config', '--help'], ['status', '--help']):\n"
            "    try:\n        app(args)\n    except SystemExit as e:\n        assert e.code == 0, (args, e.code)\n"
            f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {allowed!r} "
            "or m == 'draftsmith.metrics')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
    assert "Usage" in out.stdout
