"""The modules of ``hps.ssd`` import each other without a cycle (imports inside functions count):
the store sits on compaction, recovery and the file layer, never the other way round."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hps" / "ssd"


def _graph() -> dict[str, set[str]]:
    """module name -> the sibling modules it imports anywhere in its body."""
    names = {p.stem for p in PACKAGE.glob("*.py")}
    graph = {}
    for path in PACKAGE.glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:                      # from ._x import y
                    deps.add(node.module.split(".")[0])
                else:                                # from . import _x
                    deps.update(a.name for a in node.names)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                mod = node.module if isinstance(node, ast.ImportFrom) else None
                for m in [mod] if mod else [a.name for a in node.names]:
                    if m and m.startswith("hps.ssd."):
                        deps.add(m.split(".")[2])
        graph[path.stem] = (deps & names) - {path.stem}
    return graph


def _cycle(graph):
    """One import cycle as a list of modules, or None."""
    state = {}

    def visit(m, stack):
        state[m] = "open"
        for d in sorted(graph[m]):
            if state.get(d) == "open":
                return stack[stack.index(d):] + [d]
            if d not in state:
                found = visit(d, stack + [d])
                if found:
                    return found
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m, [m])
            if found:
                return found
    return None


def test_the_graph_sees_function_level_imports():
    g = _graph()
    assert "_format" in g["_store"] and "_format" in g["_compaction"]
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]


def test_hps_ssd_has_no_import_cycle():
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle in hps.ssd: " + " -> ".join(cycle)
