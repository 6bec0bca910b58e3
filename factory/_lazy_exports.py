"""Package attributes imported on first use (PEP 562), for packages whose heavy modules most callers never need."""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import import_module
from typing import Any

__all__: list[str] = []  # internal: packages use it, nothing re-exports it


def lazy_exports(package: str, modules: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` resolving ``name`` from ``package.<modules[name]>`` once, then caching it.

    Args:
        package: The package's ``__name__``.
        modules: Attribute name -> private module name inside the package (``"_dpo"``).
    """

    def __getattr__(name: str) -> Any:
        if name in modules:
            value = getattr(import_module(f"{package}.{modules[name]}"), name)
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
