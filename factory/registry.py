"""One registry class behind every extension point.

Each extension point keeps one :class:`Registry` beside its protocol:
``SANDBOXES`` (``--sandbox``), ``MODELS`` (model prefixes), ``VERIFIERS``,
``MEMORY_BACKENDS``, ``EMBEDDERS``, ``EXPORT_FORMATS`` and ``TRAINERS``. The
built-ins register where they are defined, a user's plugin registers the same
way, and a conformance suite parametrizes over :meth:`Registry.names`, so a
new implementation is checked like the built-ins.

An entry is whatever builds an implementation (a class, a factory function, or
a description that imports lazily, as the trainers do): the registry stores it
and never calls it, so listing names imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar, overload

from factory.errors import ConfigError

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Entries of one kind, by name.

    Example::

        SANDBOXES: Registry[type[Sandbox]] = Registry("sandbox")

        @SANDBOXES.register("bwrap")
        class BwrapSandbox(Sandbox): ...

        SANDBOXES.register("mine", MySandbox)  # the same, as a direct call
        SANDBOXES.get("bwrap")                  # BwrapSandbox

    Args:
        kind: What an entry is, as error messages name it (``"sandbox"``, ``"export format"``).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, entry: T) -> T: ...

    def register(self, name: str, entry: T | None = None) -> T | Callable[[T], T]:
        """Register (or replace) ``entry`` under ``name``.

        Args:
            name: The name users choose it by.
            entry: What to register; without it, returns a decorator that registers what it decorates.

        Returns:
            ``entry`` itself (or the decorator), so a decorated class or function is unchanged.
        """
        if entry is None:
            return lambda decorated: self.register(name, decorated)
        self._entries[name] = entry
        return entry

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def get(self, name: str) -> T:
        """The entry registered as ``name``.

        Raises:
            ConfigError: If nothing has that name; the message lists the names there are.
        """
        try:
            return self._entries[name]
        except KeyError:
            raise ConfigError(f"unknown {self.kind} '{name}' (choose from: {', '.join(self.names())})") from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()!r})"
