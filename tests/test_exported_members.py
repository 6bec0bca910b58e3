"""Every package re-exports the public names of its private modules in ``__all__``."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import factory
from factory.cli import COMMANDS

# Command modules are reached through the lazy group, never re-exported: that
# would import them (and what they import) whenever `factory.cli` is imported.
LAZY_COMMAND_MODULES = {target.split(":")[0] for target in COMMANDS.values()}



def packages() -> list[str]:
    found = ["factory"]
    for info in pkgutil.walk_packages(factory.__path__, "factory."):
        if info.ispkg:
            found.append(info.name)
    return found


@pytest.mark.parametrize("name", packages())
def test_package_all_is_complete(name):
    package = importlib.import_module(name)
    exported = set(getattr(package, "__all__", ()))
    for attribute in exported:
        assert hasattr(package, attribute), f"{name}.__all__ names missing attribute {attribute}"
    for info in pkgutil.iter_modules(package.__path__):
        if info.ispkg or not info.name.startswith("_") or info.name.startswith("__"):
            continue
        if f"{name}.{info.name}" in LAZY_COMMAND_MODULES or info.name == "_version":
            continue
        module = importlib.import_module(f"{name}.{info.name}")
        public = set(getattr(module, "__all__", ()))
        assert hasattr(module, "__all__"), f"{module.__name__} has no __all__"
        missing = public - exported
        assert not missing, f"{name}.__all__ lacks {sorted(missing)} from {module.__name__}"
