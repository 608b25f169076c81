"""One registry for every extension point (strategies, advantage estimators, environments,
generators, loaders, predictors, engines): a duplicate name is rejected, an unknown name raises
``KeyError`` listing the known ones, and a lazy entry ("package.module:attr") is imported only
when it is first asked for (so vLLM or transformers load only when chosen)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(dict[str, T], Generic[T]):
    """A ``dict`` of name -> item with checked registration and helpful lookups."""

    def __init__(self, kind: str, lazy: dict[str, str] | None = None) -> None:
        super().__init__()
        self.kind = kind
        self.lazy: dict[str, str] = dict(lazy or {})

    def add(self, name: str, item: T) -> T:
        if name in self or name in self.lazy:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self[name] = item
        return item

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator form of ``add``."""
        return lambda item: self.add(name, item)

    def add_lazy(self, name: str, import_path: str) -> None:
        if ":" not in import_path:
            raise ValueError(f"import path {import_path!r} must look like 'package.module:attr'")
        if name in self or name in self.lazy:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self.lazy[name] = import_path

    def names(self) -> list[str]:
        return sorted(set(self) | set(self.lazy))

    def get_item(self, name: str) -> T:
        """The item for ``name``, importing a lazy entry on first use."""
        if name not in self and name in self.lazy:
            module, attr = self.lazy[name].split(":")
            self[name] = getattr(importlib.import_module(module), attr)
        if name not in self:
            raise KeyError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")
        return self[name]
