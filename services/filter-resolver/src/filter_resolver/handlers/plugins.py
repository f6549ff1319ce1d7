"""Plugin handlers (RF-09), from `ROW_FILTERS_MODULES` and the `celine.dataset.row_filters` entry
points, through `dataplane_contracts.plans.RowFilterPlugin`.

A module in ROW_FILTERS_MODULES declares its handlers in one of two ways:
- a module-level `ROW_FILTERS` — a list of plugin objects (or classes, instantiated with no
  arguments); or
- a `register(registry)` function that calls `registry.add(plugin)` for each.
A module that cannot be imported, or declares neither, stops the service at start-up: a handler
named by the catalogue but missing here would refuse every request for that dataset.
An entry point names a plugin class (instantiated) or object; one that fails to load is logged
and skipped — a request naming it is then refused as unknown (RF-06), never served unfiltered.

`keys` is passed only to a `resolve` that declares it or takes **kwargs, so a plugin written
before typed keys keeps working (RF-09)."""

from __future__ import annotations

import asyncio
import importlib
import inspect
from collections.abc import Iterable
from importlib.metadata import entry_points
from typing import Any

from pydantic import ValidationError

from dataplane_contracts.plans import ENTRY_POINT_GROUP, ClaimCheck, Plan, accepts_keys
from dataplane_service_kit.logs import get_logger
from filter_resolver.errors import invalid, unenforceable

log = get_logger(__name__)


class PluginLoadError(Exception):
    """A configured plugin module cannot be used; the message names the module, nothing else."""


class PluginHandler:
    """Adapts a RowFilterPlugin to the resolver's Handler interface."""

    def __init__(self, plugin: Any) -> None:
        name = getattr(plugin, "name", None)
        resolve = getattr(plugin, "resolve", None)
        if not isinstance(name, str) or not name or not callable(resolve):
            raise TypeError("a row-filter plugin has a non-empty `name` and a callable `resolve`")
        self.name = name
        self._resolve = resolve
        self._wants_keys = accepts_keys(resolve)  # checked once per handler

    async def resolve(self, claim: ClaimCheck) -> Plan:
        kwargs: dict[str, Any] = {
            "table": claim.table,
            "args": dict(claim.args),
            "caller": claim.caller,
            "principals": None if claim.principals is None else list(claim.principals),
            "request_context": dict(claim.request_context),
        }
        if self._wants_keys:
            kwargs["keys"] = list(claim.keys)
        try:
            if inspect.iscoroutinefunction(self._resolve):
                result = await self._resolve(**kwargs)
            else:
                # a synchronous plugin may block (a driver call): keep it off the event loop
                result = await asyncio.to_thread(self._resolve, **kwargs)
                if inspect.isawaitable(result):
                    result = await result
        except NotImplementedError:
            raise unenforceable(f"{self.name} refuses this request") from None
        except (ValueError, TypeError, KeyError):
            raise invalid(f"{self.name}: the handler refused its arguments") from None
        return _as_plan(self.name, result)


def _as_plan(name: str, result: Any) -> Plan:
    if isinstance(result, Plan):
        return result
    if isinstance(result, dict):
        try:
            return Plan.model_validate(result)
        except ValidationError:
            pass
    raise invalid(f"{name}: the handler did not answer a plan")


def _instances(declared: Iterable[Any]) -> list[Any]:
    return [obj() if inspect.isclass(obj) else obj for obj in declared]


class PluginCollector:
    """What `register(registry)` receives."""

    def __init__(self) -> None:
        self.plugins: list[PluginHandler] = []

    def add(self, plugin: Any) -> None:
        self.plugins.append(PluginHandler(plugin() if inspect.isclass(plugin) else plugin))


def load_module_plugins(modules: Iterable[str]) -> list[PluginHandler]:
    out: list[PluginHandler] = []
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            raise PluginLoadError(f"ROW_FILTERS_MODULES: cannot import {module_name!r}") from exc
        collector = PluginCollector()
        try:
            register = getattr(module, "register", None)
            declared = getattr(module, "ROW_FILTERS", None)
            if callable(register):
                register(collector)
            elif declared is not None:
                for plugin in _instances(declared):
                    collector.add(plugin)
            else:
                raise PluginLoadError(
                    f"ROW_FILTERS_MODULES: {module_name!r} has neither ROW_FILTERS nor register()"
                )
        except PluginLoadError:
            raise
        except Exception as exc:
            raise PluginLoadError(f"ROW_FILTERS_MODULES: {module_name!r} failed to register") from exc
        out.extend(collector.plugins)
    return out


def load_entry_point_plugins(group: str = ENTRY_POINT_GROUP) -> list[PluginHandler]:
    out: list[PluginHandler] = []
    for ep in entry_points(group=group):
        try:
            obj = ep.load()
            out.append(PluginHandler(obj() if inspect.isclass(obj) else obj))
        except Exception as exc:
            log.error("row_filter_entry_point_failed", entry_point=ep.name, error=type(exc).__name__)
    return out
