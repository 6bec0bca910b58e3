"""Dependencies flow one way through the layers: an upward or sideways import fails here.

The order (lowest first) is the architecture in ``factory/__init__.py``'s
docstring. Every import counts — module level, inside functions and under
``TYPE_CHECKING`` — so a cycle cannot hide behind a lazy import.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

import factory

#: Lowest first. Units on one line are peers: neither may import the other.
LAYERS: list[tuple[str, ...]] = [
    ("factory._version", "factory.errors", "factory._lazy_exports"),
    ("factory.settings", "factory.provenance", "factory.registry", "factory.records", "factory.outputs"),
    ("factory.tasks", "factory.store"),
    ("factory.sandbox", "factory.models"),
    ("factory.verifiers",),
    ("factory.rollouts",),
    ("factory.ranking", "factory.feedback"),
    ("factory.memory", "factory.export"),
    ("factory.trainers", "factory.view"),
    ("factory.cli",),
]
#: The root package only re-exports (lazily); it may reach any layer.
ROOT = "factory"


def unit_of(module: str) -> str:
    """The layered unit a module belongs to (its top-level package or module under ``factory``)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else parts[0]


def layer_of(unit: str) -> int:
    for index, units in enumerate(LAYERS):
        if unit in units:
            return index
    raise AssertionError(f"{unit} is in no layer: add it to LAYERS in tests/test_layers.py")


def module_name(root: Path, path: Path) -> str:
    relative = path.relative_to(root.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in ``tree``, relative imports resolved."""
    found = []
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            # `from factory import store` imports factory.store
            if target == ROOT:
                found.extend((node.lineno, f"{ROOT}.{alias.name}") for alias in node.names)
    return [(line, name) for line, name in found if name == ROOT or name.startswith(ROOT + ".")]


def layer_violations(root: Path) -> list[str]:
    """Every import in the package at ``root`` that goes up or sideways across layers."""
    problems = []
    for path in sorted(root.rglob("*.py")):
        module = module_name(root, path)
        source_unit = unit_of(module)
        if source_unit == ROOT:
            continue
        source_layer = layer_of(source_unit)
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, target in imported_modules(tree, module, path.name == "__init__.py"):
            target_unit = unit_of(target)
            if target_unit in (source_unit, ROOT):
                if target_unit == ROOT and target == ROOT:
                    problems.append(f"{path}:{line}: {module} imports the root package {ROOT}")
                continue
            target_layer = layer_of(target_unit)
            if target_layer > source_layer:
                problems.append(f"{path}:{line}: {module} imports {target} (layer {target_layer} above "
                                f"{source_unit}'s layer {source_layer})")
            elif target_layer == source_layer:
                problems.append(f"{path}:{line}: {module} imports its peer {target} (same layer)")
    return problems


def test_imports_flow_one_way():
    root = Path(factory.__file__).parent
    assert layer_violations(root) == []


def test_every_unit_has_a_layer():
    root = Path(factory.__file__).parent
    units = {unit_of(module_name(root, p)) for p in root.rglob("*.py")} - {ROOT}
    for unit in units:
        layer_of(unit)


@pytest.mark.parametrize(("module", "line"), [
    ("verifiers/_base.py", "from factory.rollouts import ToolCallingAgent\n"),
    ("sandbox/_base.py", "def f():\n    from factory.models import ChatModel\n"),
    ("store/_store.py", "from ..ranking import load_records\n"),
    ("export/_files.py", "import factory.memory\n"),
])
def test_an_upward_or_sideways_import_fails(tmp_path, module, line):
    """The check is not vacuous: planting one bad import (lazy and relative ones too) is caught."""
    copy = tmp_path / "factory"
    shutil.copytree(Path(factory.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / module
    target.write_text(target.read_text() + "\n" + line)
    problems = layer_violations(copy)
    assert len(problems) == 1 and module in problems[0], problems
