"""RF-09: plugin handlers from ROW_FILTERS_MODULES and the `celine.dataset.row_filters` entry
points; `keys` reaches only a resolve that declares it (or takes **kwargs)."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from dataplane_testing.resolver import claim, make_settings, person
from filter_resolver.handlers.plugins import PluginLoadError, load_entry_point_plugins, load_module_plugins

PLUGINS = '''
from dataplane_contracts.plans import Plan

class Legacy:
    """Written before typed keys: no `keys` parameter, synchronous."""
    name = "legacy_{u}"
    def resolve(self, table, args, caller, principals, request_context):
        return Plan.among(args["column"], [table, caller.username, request_context.get("purpose", "-")])

class Keyed:
    name = "keyed_{u}"
    async def resolve(self, *, table, args, caller, principals, request_context, keys):
        return Plan.among(args["column"], sorted(k.split(":", 1)[1] for k in keys), key_type="pod")

class Catchall:
    name = "catchall_{u}"
    async def resolve(self, **kwargs):
        return {{"kind": "in", "column": "c", "values": [",".join(sorted(kwargs)), len(kwargs["keys"])]}}

class Refuser:
    name = "refuser_{u}"
    async def resolve(self, *, principals, **_):
        if principals is not None:
            raise NotImplementedError("refuses delegation")
        return Plan.allow_all()

class Broken:
    name = "broken_{u}"
    def resolve(self, **_):
        return "not a plan"

ROW_FILTERS = [Legacy(), Keyed, Catchall()]

def register(registry):
    for plugin in ROW_FILTERS:
        registry.add(plugin)
    registry.add(Refuser())
    registry.add(Broken)
'''


@pytest.fixture
def plugin_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    u = uuid.uuid4().hex[:8]
    name = f"rf_plugins_{u}"
    (tmp_path / f"{name}.py").write_text(PLUGINS.format(u=u))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name, u


async def test_rf09_plugin_without_keys_resolves(
    make_harness: Any, fresh_doubles: Any, plugin_module: Any
) -> None:
    name, u = plugin_module
    async with make_harness(plugins=load_module_plugins([name])) as h:
        check = claim(
            f"legacy_{u}",
            {"column": "c"},
            table="t.x",
            caller=person(fresh_doubles.issuer, "al"),
            keys=("pod:IT-1",),
            request_context={"purpose": "billing"},
        )
        plan = await h.plan(check)
    assert plan.values == ("t.x", "al", "billing")


async def test_rf09_plugin_declaring_keys_receives_them(make_harness: Any, plugin_module: Any) -> None:
    name, u = plugin_module
    async with make_harness(plugins=load_module_plugins([name])) as h:
        plan = await h.plan(claim(f"keyed_{u}", {"column": "pod"}, principals=(), keys=("pod:B", "pod:A")))
    assert plan.values == ("A", "B")
    assert (plan.meta.count, plan.meta.key_type) == (2, "pod")


async def test_rf09_plugin_with_kwargs_receives_keys(make_harness: Any, plugin_module: Any) -> None:
    name, u = plugin_module
    async with make_harness(plugins=load_module_plugins([name])) as h:
        plan = await h.plan(claim(f"catchall_{u}", {}, principals=("p",), keys=("pod:A", "pod:B", "pod:C")))
    assert plan.values == ("args,caller,keys,principals,request_context,table", 3)


async def test_register_function_and_class_entries(make_harness: Any, plugin_module: Any) -> None:
    name, u = plugin_module
    plugins = load_module_plugins([name])
    assert sorted(p.name for p in plugins) == sorted(
        f"{n}_{u}" for n in ("legacy", "keyed", "catchall", "refuser", "broken")
    )
    async with make_harness(plugins=plugins) as h:
        refused = await h.resolve(claim(f"refuser_{u}", {}, principals=()))
        broken = await h.resolve(claim(f"broken_{u}", {}))
    assert refused.error_code == "row_filter_unenforceable"
    assert broken.error_code == "row_filter_invalid"


def test_row_filters_modules_is_comma_separated() -> None:
    settings = make_settings(row_filters_modules="a.b, c ,,d")
    assert settings.row_filters_modules == ("a.b", "c", "d")


def test_unimportable_module_stops_the_start() -> None:
    with pytest.raises(PluginLoadError, match="rf_missing_module"):
        load_module_plugins(["rf_missing_module"])


def test_module_declaring_nothing_stops_the_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"rf_empty_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginLoadError, match="neither"):
        load_module_plugins([name])


async def test_a_name_is_taken_once(make_harness: Any, plugin_module: Any) -> None:
    name, _ = plugin_module
    with pytest.raises(PluginLoadError, match="twice"):
        async with make_harness(plugins=load_module_plugins([name, name])):
            pass


async def test_plugin_cannot_shadow_a_builtin(make_harness: Any) -> None:
    from filter_resolver.handlers.plugins import PluginHandler

    class Impostor:
        name = "rec_registry"

        def resolve(self, **_: Any) -> Any:
            raise AssertionError

    with pytest.raises(PluginLoadError, match="twice"):
        async with make_harness(plugins=[PluginHandler(Impostor())]):
            pass


def test_rf09_entry_point_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    u = uuid.uuid4().hex[:8]
    module = f"rf_ep_{u}"
    (tmp_path / f"{module}.py").write_text(PLUGINS.format(u=u))
    dist = tmp_path / f"rf_ep_{u}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: rf-ep-{u}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        textwrap.dedent(
            f"""\
            [celine.dataset.row_filters]
            keyed = {module}:Keyed
            legacy = {module}:ROW_FILTERS
            missing = {module}:DoesNotExist
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    names = [p.name for p in load_entry_point_plugins()]
    # the class is instantiated; a list or a missing object is not a plugin: logged and skipped
    assert f"keyed_{u}" in names
    assert not any(n.startswith(("legacy_", "catchall_")) and n.endswith(u) for n in names)
