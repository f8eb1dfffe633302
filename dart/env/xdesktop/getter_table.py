"""A table of getters a module defines with ``@getter("name")`` and hands to the evaluator
registry in one call, after the registry exists (the xdesktop getter modules use it so that
importing them registers nothing by itself)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dart.errors import ConfigError


class GetterTable:
    def __init__(self, what: str) -> None:
        self.what = what
        self.table: dict[str, Callable[..., Any]] = {}

    def __call__(self, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: ``fn`` is the getter named ``name`` (an OSWorld ``result``/``expected`` type)."""
        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.table[name] = fn
            return fn

        return deco

    def register_all(self, register_getter: Any) -> None:
        if not self.table:
            raise ConfigError(f"no {self.what} getters defined")
        for name, fn in self.table.items():
            register_getter(name)(fn)
