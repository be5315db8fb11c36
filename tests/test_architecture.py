"""The layering rules of docs/architecture.md, read from the source with `ast`: who may
import whom, no import loop in the worker or the controller, and SQL in `outbox/` only.

Nothing is imported or run: every module is parsed as text, so a component whose extra is
not installed is checked too.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Who may import whom (DESIGN.md's layout table): the protocol imports no component, and
# each component imports the protocol and itself only. What two components need goes into
# `outbox/`.
MAY_IMPORT = {
    "outbox": {"outbox"},
    "worker": {"outbox", "worker"},
    "controller": {"outbox", "controller"},
    "tui": {"outbox", "tui"},
    "receiver": {"outbox", "receiver"},
}
# What the plain install brings besides the standard library: `outbox/` imports nothing
# else when it is loaded. A function may import an optional library (the producer reads
# OpenTelemetry's context only where the application has loaded it).
PROTOCOL_LIBRARIES = {"psycopg"}

# A statement in a string: a keyword that starts one, in capitals, as this project writes SQL.
SQL_TEXT = re.compile(
    r"(?:^|[\s(])(?:SELECT|INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s|^\s*SET\s+\w+\s*(?:=|TO\s)"
)
# Component files that still hold SQL of their own, each until its statements move into
# `outbox/`. An entry that no longer holds any fails the test: the list only shrinks.
SQL_NOT_MOVED_YET: dict[str, str] = {}


@dataclass(frozen=True)
class Import:
    target: str  # the module imported, absolute (`outbox.worker.tracing`)
    line: int
    runtime: bool  # False: under `if TYPE_CHECKING:`, for annotations only
    lazy: bool  # inside a function: runs when called, not when the module loads


@dataclass(frozen=True)
class Module:
    name: str  # `outbox.worker.claimer`
    path: Path
    component: str  # a key of MAY_IMPORT
    tree: ast.Module

    @property
    def where(self) -> str:
        return str(self.path.relative_to(ROOT))

    @property
    def package(self) -> str:
        return self.name if self.path.name == "__init__.py" else self.name.rpartition(".")[0]


@cache
def _folders() -> dict[str, str]:
    """Import name of each folder the build maps into the `outbox` namespace (pyproject's
    package-dir): `outbox.worker` -> `worker`."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return dict(pyproject["tool"]["setuptools"]["package-dir"])


def component_of(name: str) -> str | None:
    """The component a module belongs to by its import name; None outside the project."""
    if name != "outbox" and not name.startswith("outbox."):
        return None
    packages = sorted(_folders(), key=len, reverse=True)
    package = next(p for p in packages if name == p or name.startswith(p + "."))
    return "outbox" if package == "outbox" else package.removeprefix("outbox.")


@cache
def modules() -> dict[str, Module]:
    found: dict[str, Module] = {}
    for package, folder in _folders().items():
        component = component_of(package)
        if component not in MAY_IMPORT:
            continue  # the demo: not a component of the layout
        base = ROOT / folder
        # `outbox/` holds the protocol's modules only: the components are folders of their own.
        files = base.glob("*.py") if package == "outbox" else base.rglob("*.py")
        for path in sorted(files):
            parts = path.relative_to(base).with_suffix("").parts
            name = ".".join((package, *parts)).removesuffix(".__init__")
            tree = ast.parse(path.read_text(), str(path))
            found[name] = Module(name, path, component, tree)
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(module: Module) -> Iterator[Import]:
    """Every import of the module, resolved to an absolute module name: `from package import
    name` names the submodule when `name` is one."""

    def walk(node: ast.AST, runtime: bool, lazy: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield Import(alias.name, child.lineno, runtime, lazy)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    package = module.package.split(".")
                    anchor = ".".join(package[: len(package) - child.level + 1])
                    base = f"{anchor}.{base}" if base else anchor
                for alias in child.names:
                    submodule = f"{base}.{alias.name}"
                    target = submodule if submodule in modules() else base
                    yield Import(target, child.lineno, runtime, lazy)
            else:
                in_function = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
                checking = isinstance(child, ast.If) and _is_type_checking(child)
                yield from walk(child, runtime and not checking, lazy or in_function)

    yield from walk(module.tree, True, False)


def test_every_component_is_read():
    read = {m.component for m in modules().values()}
    assert read == set(MAY_IMPORT)
    assert len(modules()) > 50


@pytest.mark.parametrize("component", sorted(MAY_IMPORT))
def test_a_component_imports_only_what_the_layout_allows(component: str):
    allowed = MAY_IMPORT[component]
    wrong = [
        f"{m.where}:{i.line} imports {i.target}"
        for m in modules().values()
        if m.component == component
        for i in imports(m)
        if (target := component_of(i.target)) is not None and target not in allowed
    ]
    assert not wrong, f"{component} may import {sorted(allowed)} only:\n" + "\n".join(wrong)


def test_the_protocol_loads_with_the_plain_install_alone():
    libraries = set(sys.stdlib_module_names) | PROTOCOL_LIBRARIES | {"outbox", "__future__"}
    wrong = [
        f"{m.where}:{i.line} imports {i.target}"
        for m in modules().values()
        if m.component == "outbox"
        for i in imports(m)
        if i.runtime and not i.lazy and i.target.split(".")[0] not in libraries
    ]
    assert not wrong, "outbox/ loads with psycopg and the standard library only:\n" + "\n".join(
        wrong
    )


def import_graph(names: set[str]) -> dict[str, list[str]]:
    """Who imports whom among `names`, counting every import that runs: those inside
    functions too (an import moved into a function hides a loop from Python at load, not
    from the design). One for annotations only (`if TYPE_CHECKING:`) never runs: a module
    may name the type of another that uses it."""
    return {
        name: sorted(
            {i.target for i in imports(modules()[name]) if i.runtime and i.target in names}
        )
        for name in names
    }


def loops(edges: dict[str, list[str]]) -> list[list[str]]:
    """The loops of a graph: each strongly connected set of nodes (Tarjan's), by name."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for target in edges[name]:
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            members = []
            while (member := stack.pop()) != name:
                members.append(member)
            members.append(name)
            if len(members) > 1 or name in edges[name]:
                found.append(sorted(members))

    for name in sorted(edges):
        if name not in index:
            visit(name)
    return sorted(found)


def test_the_loop_finder_finds_every_loop_and_only_loops():
    graph = {"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a", "d"], "e": ["f"], "f": []}
    assert loops(graph) == [["a", "b", "c"], ["d"]]
    assert loops({"a": ["b"], "b": []}) == []


def test_imports_are_read_as_modules():
    publishing = modules()["outbox.worker.publishing"]
    targets = {i.target for i in imports(publishing)}
    # `from outbox.worker import tracing` names the module, not the package.
    assert "outbox.worker.tracing" in targets and "outbox.worker" not in targets


@pytest.mark.parametrize("component", ["worker", "controller"])
def test_no_import_loop_among_a_components_modules(component: str):
    names = {name for name, m in modules().items() if m.component == component}
    found = loops(import_graph(names))
    assert not found, "import loops:\n" + "\n".join(" <-> ".join(group) for group in found)


def _docstrings(tree: ast.Module) -> set[int]:
    kinds = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def sql_texts(module: Module) -> list[str]:
    """The string literals of the module that hold SQL (docstrings, which may quote a
    statement to explain it, aside)."""
    docstrings = _docstrings(module.tree)
    return [
        f"{module.where}:{node.lineno} {node.value[:60]!r}"
        for node in ast.walk(module.tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and SQL_TEXT.search(node.value)
    ]


def test_sql_lives_in_the_protocol_only():
    found = {
        m.where: texts
        for m in modules().values()
        if m.component != "outbox" and (texts := sql_texts(m))
    }
    unexpected = [text for where, texts in found.items() if where not in SQL_NOT_MOVED_YET
                  for text in texts]  # fmt: skip
    assert not unexpected, "SQL outside outbox/ (move it into a module there):\n" + "\n".join(
        unexpected
    )
    moved = sorted(set(SQL_NOT_MOVED_YET) - set(found))
    assert not moved, f"no SQL left in {moved}: take them off SQL_NOT_MOVED_YET"


def test_the_sql_finder_finds_sql_and_leaves_prose():
    assert SQL_TEXT.search("SELECT 1")
    assert SQL_TEXT.search("WITH x AS (SELECT 1) UPDATE t SET a = 1")
    assert SQL_TEXT.search("SET TimeZone = 'UTC'")
    assert SQL_TEXT.search("DELETE FROM t")
    assert not SQL_TEXT.search("select a destination, then update the list")
    assert not SQL_TEXT.search("SELECTED")


def test_every_package_of_the_tree_is_in_the_built_distribution() -> None:
    """A subpackage the packages list forgets works in the editable install and the tests,
    and is missing from the wheel and the image."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    found = set()
    for name, folder in setuptools["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *parts)))
    assert found <= listed, sorted(found - listed)
