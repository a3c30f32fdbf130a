"""One registry per pluggable kind (docs/architecture.md §3, "Rules of the house").

A :class:`Registry` maps a permanent name (used on the CLI and in stored runs)
to an implementation. Registering a name twice is an error, and looking up an
unknown name raises :class:`KeyError` listing the names that exist.

Example
-------
>>> policies = Registry("router policy")
>>> @policies.register("first")
... def first(xs):
...     return xs[0]
>>> policies.get("first")([3, 4])
3
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Name → implementation table for one pluggable kind.

    Thread safety: registration happens at import time; lookups are read-only
    and safe from any thread.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator registering ``obj`` under ``name``.

        Raises:
            ValueError: ``name`` is already registered for this kind.
        """

        def decorator(obj: T) -> T:
            self.add(name, obj)
            return obj

        return decorator

    def add(self, name: str, obj: T) -> None:
        """Register ``obj`` under ``name``; raises ``ValueError`` on a duplicate name."""
        if name in self._entries:
            raise ValueError(f"duplicate {self.kind} name {name!r}: already registered")
        self._entries[name] = obj

    def get(self, name: str) -> T:
        """Return the implementation registered as ``name``.

        Raises:
            KeyError: unknown name; the message lists the registered names.
        """
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "(none)"
            raise KeyError(f"unknown {self.kind} {name!r}; expected one of: {known}") from None

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def items(self) -> list[tuple[str, T]]:
        """``(name, implementation)`` pairs in registration order."""
        return list(self._entries.items())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
