"""The package's layout: every module short enough to read whole, and no import cycles.

A reader finds the dialect, each pass and each level's lowering by file name; a module over
:data:`MAX_LINES` lines holds more than one of them.  Imports at the top of a module form a
graph without cycles (an import inside a function runs when called, after every module has
loaded, and is how a module reaches one that imports it).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "explorer"
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the package (a package is its __init__)."""
    out: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _targets(node: ast.Import | ast.ImportFrom, here: str, modules: dict[str, Path]
             ) -> set[str]:
    """The package's modules that an import statement loads (by name; a name imported from a
    package is its submodule when one exists, else the package itself)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in modules}
    base = node.module or ""
    if node.level:   # relative: resolve against the importing module's package
        package = here.split(".")
        if modules[here].name != "__init__.py":
            package = package[:-1]
        package = package[:len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    out = set()
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if sub in modules:
            out.add(sub)
        elif base in modules:
            out.add(base)
    return out


def _for_type_checkers(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` or ``if False:``: imports that never run."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return ((isinstance(test, ast.Constant) and test.value is False)
            or (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _import_time_nodes(tree: ast.Module) -> list[ast.AST]:
    """The statements that run when the module is imported: all but function bodies and
    blocks for type checkers."""
    out: list[ast.AST] = []
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if _for_type_checkers(node):
            assert isinstance(node, ast.If)
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def _imports(modules: dict[str, Path], top_level_only: bool) -> dict[str, set[str]]:
    """Module -> the package's modules it imports: when it is imported (``top_level_only``),
    or anywhere, inside functions too."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        nodes = _import_time_nodes(tree) if top_level_only else list(ast.walk(tree))
        edges: set[str] = set()
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _targets(node, name, modules)
        edges.discard(name)
        graph[name] = edges
    return graph


def _components(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """A cycle through each group of modules that import one another, as the path of imports
    (it ends where it starts)."""
    paths = []
    for component in _components(graph):
        members = set(component)
        start = component[0]
        # breadth first from the start, within the component, back to the start
        previous: dict[str, str] = {}
        frontier = [start]
        while start not in previous:
            following = []
            for v in frontier:
                for w in sorted(graph[v] & members):
                    if w not in previous:
                        previous[w] = v
                        following.append(w)
            frontier = following
        path = [start]
        while len(path) == 1 or path[-1] != start:
            path.append(previous[path[-1]])
        paths.append(path[::-1])
    return paths


def test_no_module_is_over_the_line_limit():
    lines = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    too_long = {name: n for name, n in lines.items() if n > MAX_LINES}
    assert not too_long, (
        f"modules over {MAX_LINES} lines (split each by what it holds): "
        + ", ".join(f"{name} ({n} lines)" for name, n in sorted(too_long.items())))


def test_top_level_imports_have_no_cycle():
    modules = _modules()
    cycles = _cycles(_imports(modules, top_level_only=True))
    assert not cycles, (
        "modules importing one another at their top level (move the shared piece into the "
        "module that owns it, or import inside the function that needs it): "
        + "; ".join(" -> ".join(c) for c in cycles))


def test_the_import_graph_tells_import_time_from_function_level():
    modules = _modules()
    anywhere = _imports(modules, top_level_only=False)
    at_import = _imports(modules, top_level_only=True)
    # explorer imports its compiler only when compile() is called
    assert "explorer.compiler" in anywhere["explorer"]
    assert "explorer.compiler" not in at_import["explorer"]
    assert "explorer.errors" in at_import["explorer"]


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b", "c"}, "b": {"a"}, "c": {"a"}}) == [["a", "b", "a"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"e"}, "e": {"d"}}) == [
        ["d", "e", "d"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_a_name_imported_from_a_package_is_its_submodule_when_there_is_one():
    modules = {"p": Path("p/__init__.py"), "p.sub": Path("p/sub.py"), "p.q": Path("p/q.py")}
    tree = ast.parse("from p import sub, NAME\nfrom . import sub\nfrom .sub import x\n")
    found = [_targets(node, "p.q", modules) for node in tree.body
             if isinstance(node, ast.ImportFrom)]
    assert found == [{"p.sub", "p"}, {"p.sub"}, {"p.sub"}]
