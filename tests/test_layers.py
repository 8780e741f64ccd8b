"""``hps/`` in layers: no module over 450 lines, and no import cycle between its modules nor between its
packages — imports inside functions count. The command lines' parsers (``hps.cli``) sit below the
commands, and the on-disk formats (``hps.formats``) below both train and predict."""

import ast
from pathlib import Path

import pytest

HPS = Path(__file__).resolve().parents[1] / "hps"
MAX_LINES = 450


def _modules() -> dict[str, Path]:
    """Dotted name -> file of every module of hps/ (a package is its ``__init__.py``)."""
    out = {}
    for p in sorted(HPS.rglob("*.py")):
        parts = ("hps",) + p.relative_to(HPS).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The hps modules ``name`` (at ``path``) imports, anywhere in it (functions included): for ``from X
    import y``, ``X.y`` when that is a module, else ``X``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out |= {f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod for a in node.names}
    return {m for m in out if m in MODULES and m != name}


def _package(name: str) -> str:
    """The part of hps/ a module belongs to: ``hps.train`` for ``hps.train._trainer``, ``hps.config`` for
    itself, ``hps`` for the root package."""
    return ".".join(name.split(".")[:2])


def _cycle(graph: dict) -> list | None:
    """One cycle of ``graph`` (node -> successors) as a list of nodes, or None."""
    state, stack = {}, []

    def visit(v):
        state[v] = 1
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state:
                found = visit(w)
                if found:
                    return found
        state[v] = 2
        stack.pop()
        return None

    for v in sorted(graph):
        if v not in state:
            found = visit(v)
            if found:
                return found
    return None


MODULE_GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}
PACKAGE_GRAPH = {}
for _m, _deps in MODULE_GRAPH.items():
    PACKAGE_GRAPH.setdefault(_package(_m), set()).update(_package(d) for d in _deps if _package(d) != _package(_m))


def test_the_checks_see_the_house():
    assert len(MODULES) > 150 and "hps.train._trainer" in MODULES and "hps" in MODULES
    assert "hps.train._features" in MODULE_GRAPH["hps.train._trainer"]  # from ._features import …
    assert "hps.formats._checkpoint" in MODULE_GRAPH["hps.train._trainer"]  # from ..formats import _checkpoint
    assert "hps.train._run" in MODULE_GRAPH["hps.train._main"]  # inside a function
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the check finds one


def test_no_module_of_hps_is_over_450_lines():
    long = {str(p.relative_to(HPS)): n for p in MODULES.values() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_no_import_cycle_between_modules_of_hps():
    assert _cycle(MODULE_GRAPH) is None


def test_no_import_cycle_between_packages_of_hps():
    assert _cycle(PACKAGE_GRAPH) is None


@pytest.mark.parametrize("package, below", [
    ("hps.predict", "hps.train"), ("hps.profile", "hps.train"),
    ("hps.formats", "hps.train"), ("hps.formats", "hps.predict"),
    ("hps.cli", "hps.train"), ("hps.cli", "hps.predict"), ("hps.cli", "hps.profile"), ("hps.cli", "hps.convert"),
])
def test_layers_import_downwards_only(package, below):
    assert below not in PACKAGE_GRAPH[package], f"{package} imports {below}, which sits above it"
