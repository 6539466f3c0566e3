"""Plugins: a name → class registry per pluggable family (strategies, heads, ordering policies,
serving modes, gates, classifiers, search indexes, dataset loaders, model sources, vector
backends). ``modelupgrade.params`` checks every name params.yaml gives against them.

Adding a method is one file with a decorated class (a head names its kind in its class statement:
``modelupgrade.heads.base.Head``); nothing else in the code branches on its name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from modelupgrade.errors import UserError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, family: str) -> None:
        self.family = family
        self._entries: dict[str, type[T]] = {}

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        def decorator(cls: type[T]) -> type[T]:
            if name in self._entries:
                raise ValueError(f"{self.family} {name!r} is registered twice")
            self._entries[name] = cls
            # The class learns the name it is registered under; T need not declare it.
            cls.registry_name = name  # type: ignore[attr-defined]
            return cls

        return decorator

    def get(self, name: str) -> type[T]:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "none"
            raise UserError(
                f"unknown {self.family} {name!r}", hint=f"choose one of: {known}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
