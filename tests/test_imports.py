"""The package's modules import one another without a circle: every import counted, those inside functions too
(a lazy import is still a dependency), only `if TYPE_CHECKING:` blocks left out (annotations, never run)."""

import ast
from pathlib import Path

import edgespec

ROOT = Path(edgespec.__file__).parent


def modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = ("edgespec", *path.relative_to(ROOT).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported(tree: ast.AST, names: dict[str, Path]) -> set[str]:
    """The package modules `tree` imports, outside `if TYPE_CHECKING:` blocks."""
    found: set[str] = set()

    def visit(node):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            return
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("edgespec"):
            for alias in node.names:  # `from edgespec.backends import gguf_file` imports a module
                found.add(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in names else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("edgespec"))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {name for name in found if name in names}


def test_no_module_imports_itself_through_others():
    names = modules()
    graph = {name: imported(ast.parse(path.read_text()), names) - {name} for name, path in names.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def walk(name, path):
        state[name] = 1
        for other in sorted(graph[name]):
            if state.get(other) == 1:
                raise AssertionError("import circle: " + " -> ".join([*path[path.index(other):], other]))
            if other not in state:
                walk(other, [*path, other])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name, [name])
    assert len(graph) > 80  # the walk read the package
