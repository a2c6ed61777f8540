"""The package's shape: its parts stand in one order and a lower part never imports a higher one,
no import circles within a part, no module too long to have one job, and a wheel's package list
that cannot miss a subpackage."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "specdec_cli"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runtime_imports(path: Path) -> set[str]:
    """The package modules `path` imports when it runs (lazy imports inside functions included),
    leaving out imports under `if TYPE_CHECKING:`, which never run."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    type_only = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
                 and getattr(block.test, "id", None) == "TYPE_CHECKING" for node in ast.walk(block)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {m for m in runtime_imports(path) if m in files and m != name} for name, path in files.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def without_package_inits(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """A package's __init__ re-exports its modules, and they import their siblings through it
    (`from . import x`): that is not a circle between modules."""
    inits = {name for name in graph if (PACKAGE.parent / name.replace(".", "/") / "__init__.py").is_file()}
    return {name: edges - inits for name, edges in graph.items() if name not in inits}


# The parts, lowest first, in the order the data flows: a profile's specs -> kernels and loaded
# models -> the runtime the core drives -> drafters -> the decoding core -> the Python API -> what
# is built on it -> the command line. A module may import its own part and the parts below it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("errors", "files", "cache_dirs", "run_clock", "specs", "drafter_kinds", "prompt_files", "prompt_runs", "primitives")),
    # what a generation must spell: read and checked (grammars.py) below the profile that names it
    ("constraints", ("constraints",)),
    ("profile", ("profile", "profile_checks", "profile_files", "profile_models")),
    ("kernels", ("kernels",)),
    ("models", ("models",)),
    ("runtime", ("runtime",)),
    ("drafters", ("drafters",)),
    ("decoding", ("decoding",)),
    # the package's own __init__ is the public API's front: it re-exports Pipeline and its events
    ("api", ("api", "")),
    ("training", ("training",)),
    ("serving", ("serving",)),
    ("bench", ("bench",)),
    ("serve", ("serve",)),
    ("cli", ("cli", "__main__")),
]


def layer_of(module: str) -> int:
    """The index in LAYERS of the part `module` belongs to."""
    inside = module.split(".")[1] if "." in module else ""
    for index, (_, members) in enumerate(LAYERS):
        if inside in members:
            return index
    raise KeyError(f"{module} belongs to no part: add it to LAYERS in tests/test_layout.py")


def upward_imports(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Each module's imports of a part above its own."""
    found = {name: sorted(m for m in edges if layer_of(m) > layer_of(name)) for name, edges in graph.items()}
    return {name: targets for name, targets in found.items() if targets}


def test_every_module_belongs_to_a_part():
    for name in import_graph():
        layer_of(name)


def test_imports_run_one_way_through_the_parts():
    assert upward_imports(import_graph()) == {}


def test_the_order_check_finds_an_upward_import():
    graph = {"specdec_cli.models.loading": {"specdec_cli.decoding.batched"},
             "specdec_cli.decoding.batched": {"specdec_cli.models.loading"}}
    assert upward_imports(graph) == {"specdec_cli.models.loading": ["specdec_cli.decoding.batched"]}


def test_no_import_circles():
    assert circles(without_package_inits(import_graph())) == []


def test_the_check_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_subpackage_is_a_package():
    """pyproject finds packages by their __init__.py: a folder of modules without one would be
    left out of the wheel while an editable install still worked."""
    folders = {p.parent for p in PACKAGE.rglob("*.py")}
    assert [str(f) for f in folders if not (f / "__init__.py").is_file()] == []


# past this many lines a module does more than one job: cut it by job
MAX_MODULE_LINES = 450


def long_modules(limit: int = MAX_MODULE_LINES) -> dict[str, int]:
    """The package's modules over `limit` lines, with their lengths."""
    lengths = {module_name(p): len(p.read_text(encoding="utf-8").splitlines()) for p in PACKAGE.rglob("*.py")}
    return {name: lines for name, lines in sorted(lengths.items()) if lines > limit}


def test_no_module_is_over_450_lines():
    assert long_modules() == {}
