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


# The floors of docs/layout.md, lowest first: a module imports from its own floor and those below. A package's
# floor is its top-level name's (edgespec itself, the package's __init__, is the top floor: it re-exports the API).
FLOORS = {name: floor for floor, names in enumerate((
    ("errors", "units", "progress", "machine"),
    ("backends", "models"),  # runtimes, and where model files come from
    ("decode",),  # numpy: rows in, tokens out; the loop drives drafters, named in annotations only
    ("drafts",),  # draw from decode's laws
    ("plan",),  # what fits and what pays, the simulator and the bounds
    ("export",),
    ("pair", "run", "api", "tool_calls", "web"),  # what to run and how, resolved once; the Python API
    ("parallel", "bench", "doctor", "train"),  # built on the API (train runs the target through it)
    ("server",),
    ("cli", "edgespec"),
)) for name in names}

# arrows from a lower floor to a higher one, each named and justified in docs/layout.md
UPWARD = {
    ("edgespec.doctor", "edgespec"): "the package's version (__version__ in edgespec/__init__.py)",
    ("edgespec.plan.costs", "edgespec.api"): "advise times a loaded Engine's passes and rounds: a command in plan/",
}


def test_no_module_imports_from_a_higher_floor_but_the_named_ones():
    names = modules()

    def floor(module: str) -> int:
        parts = module.split(".")
        return FLOORS[parts[1] if len(parts) > 1 else "edgespec"]

    assert set(FLOORS) >= {name.split(".")[1] for name in names if "." in name}  # every package has its floor
    upward = {(name, other) for name, path in names.items() for other in imported(ast.parse(path.read_text()), names)
              if floor(other) > floor(name)}
    assert upward == set(UPWARD), "arrows up a floor that docs/layout.md does not name: " + ", ".join(
        f"{a} -> {b}" for a, b in sorted(upward - set(UPWARD)))
