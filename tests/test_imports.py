"""The package's shape, read from its own imports (docs/architecture.md): no import cycle between modules, no import
from a lower layer to a higher one, no module over 600 lines.

Every import counts: at module level, inside functions, ``import x`` and ``from . import y`` (relative imports
resolved). An import of a package (``from ragate.methods import get_method``) is an edge to that package's
``__init__``; ``from ragate.gates import skr`` is an edge to the module ``ragate.gates.skr``. Imports under ``if
TYPE_CHECKING:`` (annotations only: they never run) count for the layers but not for cycles.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "ragate"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
MAX_LINES = 600

# The layers from the bottom of the stack up, as docs/architecture.md's table lists them (test_doc_names_these_layers
# holds the two equal): a module may import its own layer and the layers before it, never one after it. Paths are
# under src/ragate/: one ending in "/" is a folder (every module in it), else one module ("x/__init__.py" is the
# package x, "__init__.py" the package ragate); a module belongs to the layer of the most specific path naming it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("core", ("errors.py", "version.py", "types.py", "uncertainty.py", "text.py", "fileio.py")),
    ("extensions", ("plugins.py",)),
    ("models", ("models.py",)),
    ("backends", ("backends/",)),
    ("retrieval", ("retrieval/",)),
    ("gates", ("gates/",)),
    ("selection", ("selection/",)),
    ("method recipes", ("methods/",)),
    ("dynamic RAG", ("dynamic/",)),
    ("method runner", ("methods/__init__.py", "methods/question.py", "methods/runner.py", "methods/crag_lite.py")),
    ("evaluation", ("eval/",)),
    ("tuning", ("tuning/",)),
    ("reporting", ("report/",)),
    ("answers and traces", ("answers/", "tracing.py")),
    ("live state", ("state/",)),
    ("learning", ("learning/",)),
    ("pipeline", ("pipeline.py", "arguments.py")),
    ("framework adapters", ("integrations/",)),
    ("service", ("service/",)),
    ("command line", ("cli/",)),
    ("public names", ("__init__.py",)),
)
MAX_TOP_MODULES = 12  # modules loose at the top of src/ragate/ (__init__.py aside)
MAX_PACKAGE_SHARE = 0.15  # of src/ragate's lines, in any one package


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    typing_only: bool  # under `if TYPE_CHECKING:`


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, for its ``__init__.py``)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement in ``tree`` (at any depth), with whether it sits under ``if TYPE_CHECKING:``."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, typing_only: bool) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append((node, typing_only))
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, typing_only)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, typing_only)

    visit(tree, False)
    return found


def edges() -> list[Edge]:
    """Each import of one ragate module by another."""
    mods = modules()

    def nearest(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    out = []
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node, typing_only in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [nearest(a.name) for a in node.names if a.name.split(".")[0] == "ragate"]
            else:
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                if base.split(".")[0] != "ragate":
                    continue
                # `from pkg import mod` names a module; `from mod import name` names the module it is in
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else nearest(base) for a in node.names]
            for target in dict.fromkeys(targets):
                if target is not None and target != name:
                    out.append(Edge(name, target, node.lineno, typing_only))
    return out


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of the layer ``module`` belongs to (None: in none of them)."""
    rel = module.split(".")[1:]
    best: tuple[int, int] | None = None  # (specificity, layer)
    for i, (_, where) in enumerate(LAYERS):
        for entry in where:
            parts = entry.rstrip("/").split("/")
            if entry.endswith("/"):
                matched = rel[: len(parts)] == parts
                specificity = 2 * len(parts)
            else:
                parts[-1] = parts[-1].removesuffix(".py")
                if parts[-1] == "__init__":
                    parts.pop()
                matched = rel == parts
                specificity = 2 * len(parts) + 1  # a module named beats the folder it is in
            if matched and (best is None or specificity > best[0]):
                best = (specificity, i)
    return None if best is None else best[1]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for e in edges():
        if not e.typing_only:
            graph.setdefault(e.source, set()).add(e.target)
    found = cycles(graph)
    where = {(e.source, e.target): e.line for e in edges() if not e.typing_only}
    said = [
        " ; ".join(
            f"{a} -> {b}:{where[a, b]}" for a in component for b in sorted(graph.get(a, ())) if b in component
        )
        for component in found
    ]
    assert not found, "import cycles:\n" + "\n".join(said)


def test_every_module_has_a_layer() -> None:
    missing = [name for name in modules() if layer_of(name) is None]
    assert not missing, f"modules in no layer of docs/architecture.md: {missing}"


def test_no_upward_import() -> None:
    upward = []
    for e in edges():
        low, high = layer_of(e.source), layer_of(e.target)
        if low is not None and high is not None and high > low:
            upward.append(
                f"{e.source} ({LAYERS[low][0]}) imports {e.target} ({LAYERS[high][0]}) at line {e.line}"
                + (" (TYPE_CHECKING)" if e.typing_only else "")
            )
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_no_module_over_600_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in modules().values()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines (split them along their seams): {long}"


def test_the_top_holds_few_modules_and_no_package_holds_over_its_share() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_MODULES, f"{len(top)} modules at the top of src/ragate/ (at most {MAX_TOP_MODULES}): {top}"
    lines = {path: len(path.read_text(encoding="utf-8").splitlines()) for path in PACKAGE.rglob("*.py")}
    total = sum(lines.values())
    shares = {
        folder.name: sum(n for path, n in lines.items() if folder in path.parents) / total
        for folder in PACKAGE.iterdir()
        if folder.is_dir() and (folder / "__init__.py").is_file()
    }
    over = {name: round(share, 3) for name, share in shares.items() if share > MAX_PACKAGE_SHARE}
    assert not over, f"packages over {MAX_PACKAGE_SHARE:.0%} of src/ragate's lines (split them by concern): {over}"


def may_import(package: Path) -> set[str] | None:
    """The layers a package's docstring says its modules may import (its "May import:" line), or None."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8"))) or ""
    said = re.search(r"May import: ([^(]*)", " ".join(doc.split()))
    return None if said is None else {name.strip() for name in said[1].rstrip(". ").split(",")}


def test_each_package_says_what_it_may_import_and_imports_no_more() -> None:
    """A package of a concern (learning, state, answers, tuning, report, eval) names in its docstring the packages
    and top-level layers it may import, each below it in the table; its modules import nothing else of ragate."""
    names = [name for name, _ in LAYERS]
    short = {"core": "core", "models": "models", "backends": "backends", "retrieval": "retrieval", "gates": "gates",
             "selection": "selection", "methods": "method runner", "dynamic": "dynamic RAG", "eval": "evaluation",
             "tuning": "tuning", "report": "reporting", "answers": "answers and traces", "state": "live state",
             "learning": "learning", "extensions": "extensions"}  # fmt: skip
    checked, wrong = 0, []
    for package in ("learning", "state", "answers", "tuning", "report", "eval"):
        said = may_import(PACKAGE / package)
        assert said, f"src/ragate/{package}/__init__.py does not say what it may import (a 'May import:' line)"
        own = names.index(short[package])
        allowed = {names.index(short[name]) for name in said}
        assert all(i < own for i in allowed), f"{package} may import a layer not below it: {said}"
        for e in edges():
            if e.source.split(".")[:2] != ["ragate", package] or e.target.split(".")[:2] == ["ragate", package]:
                continue
            layer = layer_of(e.target)
            assert layer is not None
            extra = {"extensions"} if "core" in said else set()  # the registry sits beside the core
            ok = {names.index(short[name]) for name in said | extra}
            if layer not in ok and not (names[layer] == "method recipes" and "methods" in said):
                wrong.append(f"{e.source} imports {e.target} ({names[layer]}) at line {e.line}, not among what "
                             f"{package}/ may import: {sorted(said)}")  # fmt: skip
            checked += 1
    assert not wrong, "\n".join(wrong)
    assert checked > 50


def test_every_module_says_what_it_owns() -> None:
    """Each module opens with a docstring (its first line: what it owns)."""
    bare = [
        str(path.relative_to(ROOT))
        for path in modules().values()
        if path.read_text(encoding="utf-8").strip() and ast.get_docstring(ast.parse(path.read_text("utf-8"))) is None
    ]
    assert not bare, f"modules without a docstring: {bare}"


def doc_layers() -> list[tuple[str, tuple[str, ...]]]:
    """docs/architecture.md's layer table: each row's layer and the paths its "where" column names."""
    rows = []
    in_table = False
    for line in ARCHITECTURE.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if cells[:2] == ["layer", "where"]:
            in_table = True
            continue
        if not in_table:
            continue
        if not cells:
            break
        if set(cells[0]) <= {"-", ":"}:
            continue
        rows.append((cells[0], tuple(re.findall(r"`([^`]+)`", cells[1]))))
    return rows


def test_doc_names_these_layers() -> None:
    assert doc_layers() == [(name, where) for name, where in LAYERS]


def test_the_checks_catch_what_they_look_for(tmp_path: Path) -> None:
    """The cycle search finds a circle and skips a chain; layer_of places modules as the table says."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}}) == []
    names = [name for name, _ in LAYERS]
    assert LAYERS[layer_of("ragate.gates.targ") or 0][0] == "gates"
    assert LAYERS[layer_of("ragate") or 0][0] == "public names"
    assert LAYERS[layer_of("ragate.methods.spec") or 0][0] == "method recipes"
    assert LAYERS[layer_of("ragate.methods") or 0][0] == "method runner"
    assert LAYERS[layer_of("ragate.methods.runner") or 0][0] == "method runner"
    assert names.index("core") < names.index("gates") < names.index("method recipes") < names.index("method runner")
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\nelse:\n    import b\n"
        "def f():\n    import c\n"
    )
    found = [(type(n).__name__, n.names[0].name, t) for n, t in _imports(ast.parse(module.read_text()))]
    assert found == [("ImportFrom", "TYPE_CHECKING", False), ("Import", "a", True), ("Import", "b", False),
                     ("Import", "c", False)]  # fmt: skip
