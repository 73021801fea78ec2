"""Imports point one way, with no circle: segment_format <- coordinator <- pyspark_logsource (client <- spark).

The check is static: every module of the three packages is parsed with ``ast`` (nothing is imported), and
every import statement counts, also those inside functions and ``if TYPE_CHECKING:`` blocks, because a lazy
import is still a dependency and a circle through one is still a circle. A unit test runs the same checker on
a tiny package written to a temporary directory, so a broken checker cannot pass silently.
"""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("segment_format", "coordinator", "pyspark_logsource")

#: (importer, forbidden): a module in or under ``importer`` may import nothing in or under ``forbidden``.
RULES: tuple[tuple[str, str], ...] = (
    ("segment_format", "coordinator"),
    ("segment_format", "pyspark_logsource"),
    ("coordinator", "pyspark_logsource"),
    ("pyspark_logsource.client", "pyspark_logsource.spark"),
    ("pyspark_logsource.client", "pyspark_logsource.cli"),
    ("pyspark_logsource.client", "pyspark_logsource.views"),
    ("pyspark_logsource.spark", "pyspark_logsource.cli"),
    ("pyspark_logsource.spark", "pyspark_logsource.views"),
    ("pyspark_logsource.views", "pyspark_logsource.cli"),
    ("pyspark_logsource.views", "pyspark_logsource.spark"),
    # The CLI is the top: nothing outside it imports it (``[project.scripts]`` names it, nobody else).
    ("segment_format", "pyspark_logsource.cli"),
    ("coordinator", "pyspark_logsource.cli"),
    ("pyspark_logsource", "pyspark_logsource.cli"),
)

#: The layers inside ``segment_format``, lowest first: a module (or subpackage) may import its own layer and
#: those below, never one above.
SEGMENT_FORMAT_LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "parallel"),
    ("stores", "config", "documents", "layout", "records"),
    ("numbered", "notice", "typed"),
    ("segment", "protocol"),
    ("topic", "encoding"),
    ("shared",),
    ("log",),
    ("root",),
    ("inspect",),
)

#: The layers inside ``coordinator``, lowest first.
COORDINATOR_LAYERS: tuple[tuple[str, ...], ...] = (
    ("keys",),
    ("groups", "leases", "transactions"),
    ("collection",),
    ("maintainer",),
)


def layer_rules(package: str, layers: Sequence[Sequence[str]]) -> tuple[tuple[str, str], ...]:
    """(importer, forbidden) for every module of a layer and every module of each layer above it."""
    return tuple(
        (f"{package}.{low}", f"{package}.{high}")
        for i, layer in enumerate(layers)
        for low in layer
        for above in layers[i + 1 :]
        for high in above
    )


RULES += layer_rules("segment_format", SEGMENT_FORMAT_LAYERS)
RULES += layer_rules("coordinator", COORDINATOR_LAYERS)
RULES += (
    # Within the coordinator's middle layer: groups know nothing of leases or transactions, and back.
    ("coordinator.groups", "coordinator.leases"),
    ("coordinator.groups", "coordinator.transactions"),
    ("coordinator.leases", "coordinator.groups"),
    ("coordinator.transactions", "coordinator.groups"),
    # The Spark sink: its checks know neither the task writer nor the commit logic; the exactly-once logic
    # (sink_commit) knows nothing of the task writer; the task writer nothing of the DataSource classes.
    ("pyspark_logsource.spark.sink_checks", "pyspark_logsource.spark.task_writer"),
    ("pyspark_logsource.spark.sink_checks", "pyspark_logsource.spark.sink_commit"),
    ("pyspark_logsource.spark.sink_checks", "pyspark_logsource.spark.sink"),
    ("pyspark_logsource.spark.sink_commit", "pyspark_logsource.spark.task_writer"),
    ("pyspark_logsource.spark.sink_commit", "pyspark_logsource.spark.sink"),
    ("pyspark_logsource.spark.task_writer", "pyspark_logsource.spark.sink"),
)


@dataclass(frozen=True)
class Import:
    """One import of a project module: who imports what (and which names, for ``from m import a, b``), where."""

    importer: str
    target: str
    names: tuple[str, ...]
    where: str


@dataclass
class ImportGraph:
    """The project's modules (dotted name -> file) and every import among them."""

    modules: dict[str, Path] = field(default_factory=dict)
    imports: list[Import] = field(default_factory=list)

    def edges(self) -> dict[str, set[str]]:
        """Module -> the project modules it imports (itself excluded)."""
        graph: dict[str, set[str]] = {name: set() for name in self.modules}
        for imp in self.imports:
            if imp.target != imp.importer:
                graph[imp.importer].add(imp.target)
        return graph


def module_name(path: Path, root: Path) -> str:
    """``root/a/b/c.py`` -> ``a.b.c``; ``root/a/b/__init__.py`` -> ``a.b``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve_relative(importer: str, is_package: bool, level: int, module: str | None) -> str:
    """The absolute module of ``from <level dots><module> import ...`` written in ``importer``."""
    base = importer.split(".")
    # In a package's __init__, one dot is the package itself; in a module, it is the module's package.
    keep = len(base) - level + (1 if is_package else 0)
    prefix = base[:keep]
    return ".".join(prefix + ([module] if module else []))


def _project_module(name: str, modules: dict[str, Path]) -> str | None:
    """The longest project module that ``name`` is or lies in (``a.b.func`` -> ``a.b``), or None if outside."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _imports_in(
    tree: ast.AST, importer: str, is_package: bool, path: Path
) -> Iterator[tuple[str, tuple[str, ...], str]]:
    """(absolute module, imported names, location) for every import statement, at any depth."""
    for node in ast.walk(tree):
        where = f"{path}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, (), where
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = _resolve_relative(importer, is_package, node.level, node.module)
            yield base, tuple(alias.name for alias in node.names), where


def build_graph(root: Path, packages: Iterable[str]) -> ImportGraph:
    """Parse every module of ``packages`` under ``root`` and collect the imports among them."""
    graph = ImportGraph()
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            graph.modules[module_name(path, root)] = path
    for name, path in graph.modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for base, names, where in _imports_in(tree, name, path.name == "__init__.py", path):
            targets = _targets(base, names, graph.modules)
            for target, imported in targets:
                graph.imports.append(Import(name, target, imported, where))
    return graph


def _targets(base: str, names: tuple[str, ...], modules: dict[str, Path]) -> list[tuple[str, tuple[str, ...]]]:
    """The project modules one statement imports: ``from pkg import sub`` imports module ``pkg.sub``."""
    out: list[tuple[str, tuple[str, ...]]] = []
    plain: list[str] = []
    for name in names:
        if f"{base}.{name}" in modules:
            out.append((f"{base}.{name}", ()))
        else:
            plain.append(name)
    if plain or not names:
        target = _project_module(base, modules)
        if target is not None:
            out.append((target, tuple(plain)))
    return out


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def layering_violations(graph: ImportGraph, rules: Sequence[tuple[str, str]]) -> list[str]:
    """Every import that goes against a rule, as ``importer imports target (file:line)``."""
    found = []
    for imp in graph.imports:
        for importer, forbidden in rules:
            inside_forbidden = _within(imp.importer, forbidden)  # a package may import its own modules
            if _within(imp.importer, importer) and _within(imp.target, forbidden) and not inside_forbidden:
                found.append(
                    f"{imp.importer} imports {imp.target} ({imp.where}): {importer} may not import {forbidden}"
                )
    return found


def private_imports(graph: ImportGraph) -> list[str]:
    """Every ``from m import _name`` of another module's private name (``_name``, not ``__dunder__``)."""
    found = []
    for imp in graph.imports:
        for name in imp.names:
            if name.startswith("_") and not name.startswith("__") and imp.target != imp.importer:
                found.append(f"{imp.importer} imports private {imp.target}.{name} ({imp.where})")
    return found


def find_cycle(graph: ImportGraph) -> list[str] | None:
    """One import circle as ``[a, b, ..., a]``, or None when imports point one way."""
    try:
        graphlib.TopologicalSorter(graph.edges()).prepare()
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return None


# --- the project -----------------------------------------------------------------------------------------------


def _project() -> ImportGraph:
    graph = build_graph(ROOT, PACKAGES)
    assert len(graph.modules) > 20, f"found only {sorted(graph.modules)} under {ROOT}"
    return graph


def test_imports_follow_the_layers() -> None:
    assert layering_violations(_project(), RULES) == []


def test_every_layer_names_a_module_or_package() -> None:
    """A layer rule about a name that does not exist would pass for ever: every name must be found."""
    modules = _project().modules
    for package, layers in (("segment_format", SEGMENT_FORMAT_LAYERS), ("coordinator", COORDINATOR_LAYERS)):
        for layer in layers:
            for name in layer:
                assert f"{package}.{name}" in modules, f"{package}.{name} is not a module or package"


def test_no_import_circle() -> None:
    cycle = find_cycle(_project())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_no_module_imports_another_modules_private_name() -> None:
    assert private_imports(_project()) == []


# --- the checker itself, on a synthetic package ---------------------------------------------------------------


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


SYNTHETIC = {
    "low/__init__.py": '"""low"""\n',
    # A lazy import inside a function still counts, and a relative one is resolved.
    "low/a.py": "def f():\n    from high import e\n    return e\n",
    "low/c.py": "from .a import f\nfrom . import d\n",
    "low/d.py": "import low.c\n",
    "high/__init__.py": "",
    "high/b.py": "from low.c import _hidden\nfrom high.e import *\n",
    "high/e.py": "import json\n",
}


def test_checker_finds_a_forbidden_import_a_private_import_and_a_cycle(tmp_path: Path) -> None:
    _write(tmp_path, SYNTHETIC)
    graph = build_graph(tmp_path, ["low", "high"])
    assert set(graph.modules) == {"low", "low.a", "low.c", "low.d", "high", "high.b", "high.e"}

    violations = layering_violations(graph, [("low", "high")])
    assert len(violations) == 1 and violations[0].startswith("low.a imports high.e (")

    assert [p.split(" (")[0] for p in private_imports(graph)] == ["high.b imports private low.c._hidden"]

    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1] and set(cycle) == {"low.c", "low.d"}


def test_checker_passes_a_clean_package(tmp_path: Path) -> None:
    _write(tmp_path, {k: v for k, v in SYNTHETIC.items() if k not in ("low/a.py", "low/d.py", "high/b.py")})
    _write(tmp_path, {"low/a.py": "def f():\n    return 1\n", "high/b.py": "from low.a import f\n"})
    graph = build_graph(tmp_path, ["low", "high"])
    assert layering_violations(graph, [("low", "high")]) == []
    assert private_imports(graph) == []
    assert find_cycle(graph) is None


def test_relative_imports_resolve_like_python() -> None:
    assert _resolve_relative("p.q.m", False, 1, "x") == "p.q.x"
    assert _resolve_relative("p.q.m", False, 2, None) == "p"
    assert _resolve_relative("p.q", True, 1, "x") == "p.q.x"
    assert _resolve_relative("p.q", True, 2, "x") == "p.x"
