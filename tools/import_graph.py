"""Count the query gateway's internal modules and import edges, and look for cycles (issue 16's
acceptance: fewer modules and edges than before, still no cycle).

    uv run python tools/import_graph.py [--root services/query-gateway/src] [--package query_gateway]

Two views: every module of the package, and its top-level entries (a subpackage counts as one
node, an edge between two of them as one edge). Imports under `if TYPE_CHECKING:` are counted:
they are part of what a reader has to follow."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, module: str, is_package: bool, package: str, modules: set[str]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from pkg import mod` names the module, `from mod import obj` the module holding obj
            for alias in node.names:
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target)
    return {name for name in found if name == package or name.startswith(package + ".")}


def graph(root: Path, package: str) -> dict[str, set[str]]:
    files = sorted((root / package).rglob("*.py"))
    modules = {_module_name(f, root): f for f in files}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for imported in _imports(path, name, path.name == "__init__.py", package, set(modules)):
            target = imported
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in modules and target != name:
                targets.add(target)
        edges[name] = targets
    return edges


def top_level(edges: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    def top(name: str) -> str:
        parts = name.split(".")
        return ".".join(parts[:2])

    out: dict[str, set[str]] = {}
    for name, targets in edges.items():
        if name == package:
            continue
        node = top(name)
        out.setdefault(node, set())
        out[node].update(top(t) for t in targets if t != package and top(t) != node)
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="services/query-gateway/src", type=Path)
    parser.add_argument("--package", default="query_gateway")
    args = parser.parse_args()
    edges = graph(args.root, args.package)
    tops = top_level(edges, args.package)
    # the count issue 16 was measured by: the top level without the entry point
    main_module = f"{args.package}.__main__"
    library = {k: v - {main_module} for k, v in tops.items() if k != main_module}
    views = (("whole package", edges), ("top level", tops), ("top level without __main__", library))
    for label, view in views:
        count = sum(len(t) for t in view.values())
        loops = cycles(view)
        print(f"{label}: {len(view)} modules, {count} internal import edges, cycles: {loops or 'none'}")


if __name__ == "__main__":
    main()
