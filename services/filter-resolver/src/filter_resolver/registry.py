"""The handler registry: the built-in lookup handlers, then plugins. A name is taken once."""

from __future__ import annotations

from collections.abc import Iterable

from filter_resolver.handlers.base import Handler
from filter_resolver.handlers.plugins import PluginLoadError


class HandlerRegistry:
    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def add(self, handler: Handler) -> None:
        if handler.name in self._handlers:
            raise PluginLoadError(f"row-filter handler {handler.name!r} is registered twice")
        self._handlers[handler.name] = handler

    def extend(self, handlers: Iterable[Handler]) -> None:
        for handler in handlers:
            self.add(handler)

    def get(self, name: str) -> Handler | None:
        return self._handlers.get(name)

    def names(self) -> list[str]:
        return sorted(self._handlers)
