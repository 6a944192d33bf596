"""The house has floors: models/ at the bottom imports nothing of ours above it; explorer/ imports models/
and itself, and nothing of a server (no gradio, no asyncio, no web framework): plain functions of
Settings; server/ (what serves many visitors: admission, lanes, the event handlers, Gradio's internals)
imports explorer/ and models/, and only app.py imports it; app.py wires them and nothing imports it;
benchmarks/ and scripts/ are entry points that nothing imports; harness/ (the localhost launcher, the
benchmarks' reports) serves the tests, benchmarks and scripts and nothing below them; and no module of ours imports itself
back through others. Read from every import statement (function-level ones included), without running
any of them."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("models", "explorer", "server", "harness", "benchmarks", "scripts")
# the lower floors' whole allowance
MAY_IMPORT = {"models": {"models"}, "explorer": {"models", "explorer"}, "server": {"models", "explorer", "server"},
              "harness": {"models", "explorer", "harness"}}
ENTRY_POINTS = ("app", "benchmarks", "scripts")                            # imported by tests only
# besides tests and itself; the benchmarks and the screenshots start the app through harness.localhost
IMPORTED_ONLY_BY = {"server": {"app", "server", "benchmarks", "scripts"}, "harness": {"harness", "benchmarks", "scripts"}}
# what serves visitors, never imported below the server floor
SERVING = ("gradio", "gradio_client", "asyncio", "starlette", "fastapi", "uvicorn", "pydantic")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def our_modules() -> dict[str, Path]:
    files = [ROOT / "app.py"]
    files += [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    return {module_name(p): p for p in files}


def resolve(name: str, modules) -> str:
    """The module of ours `name` refers to: itself, or the package holding it (an imported attribute)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def imported_names(path: Path) -> set[str]:
    """Every module name an import statement of `path` names (absolute imports; ours and others')."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module)
    return found


def imports_of(name: str, path: Path, modules) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] if base else []
        else:
            continue
        found |= {resolve(t, modules) for t in targets} - {""}
    return found - {name}


def import_graph() -> dict[str, set[str]]:
    modules = our_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def floor(name: str) -> str:
    return name.split(".")[0]


def test_lower_floors_import_nothing_above_them():
    upward = [f"{m} imports {t}" for m, targets in import_graph().items() if floor(m) in MAY_IMPORT
              for t in sorted(targets) if floor(t) not in MAY_IMPORT[floor(m)]]
    assert not upward, "\n".join(upward)


def test_entry_points_are_imported_by_nothing_but_tests():
    importers = [f"{m} imports {t}" for m, targets in import_graph().items()
                 for t in sorted(targets) if floor(t) in ENTRY_POINTS]
    assert not importers, "\n".join(importers)


def test_the_server_floor_is_imported_by_the_app_alone():
    importers = [f"{m} imports {t}" for m, targets in import_graph().items() for t in sorted(targets)
                 if floor(t) in IMPORTED_ONLY_BY and floor(m) not in IMPORTED_ONLY_BY[floor(t)]]
    assert not importers, "\n".join(importers)


def test_explorer_and_models_hold_no_server_machinery():
    """explorer/ and models/ are plain functions: no Gradio, no event loop, no web framework."""
    serving = [f"{name} imports {m}" for name, path in our_modules().items() if floor(name) in ("models", "explorer")
               for m in sorted(imported_names(path)) if m.split(".")[0] in SERVING]
    assert not serving, "\n".join(serving)


def test_no_import_cycles():
    graph, cycles, done = import_graph(), [], set()

    def visit(node, path):
        if node in path:
            cycles.append(" -> ".join(path[path.index(node):] + [node]))
            return
        if node in done:
            return
        for target in sorted(graph.get(node, ())):
            visit(target, path + [node])
        done.add(node)
    for name in sorted(graph):
        visit(name, [])
    assert not cycles, "\n".join(cycles)


def test_the_graph_sees_imports():
    """The reader is not vacuous: known edges of each kind are found."""
    graph = import_graph()
    assert "models.grok" in graph["models.xrex"]                 # from .grok import ... (relative)
    assert "models.attention" in graph["explorer.timing"]        # import inside a function
    assert any(floor(t) == "explorer" for t in graph["app"])
    assert "server.endpoints" in graph["app"] and "explorer.views" in graph["server.endpoints"]
    assert "gradio" in imported_names(ROOT / "server" / "guard.py")          # the serving check reads names
    assert "asyncio" in imported_names(ROOT / "server" / "timing_events.py")
