"""Issue 31: the import boundaries, checked with the tests. `lint-imports` reads the contracts of
the workspace's pyproject.toml ([tool.importlinter]): no import cycle in any package, at any level;
the gateway's `sql/` and `rules/` import nothing of the gateway above them; code outside `sql/`
reaches it only through `sql/__init__`. The same contracts run over a small tree that breaks each
of them must report every one broken, so the check is shown able to fail."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
CONTRACTS = {"acyclic", "sql-below", "rules-below", "sql-through-init"}


def _lint(cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_issue31_the_import_boundaries_of_the_workspace_hold() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert {c["id"] for c in config["contracts"]} == CONTRACTS
    done = _lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Contracts: {len(CONTRACTS)} kept, 0 broken." in done.stdout


# each module of the tree breaks one contract; every other root package is an empty package
BROKEN_TREE = {
    "audit_relay/relay.py": "from audit_relay import partition\n",
    "audit_relay/partition.py": "from audit_relay import relay\n",
    "query_gateway/state.py": "",
    "query_gateway/clients/identity.py": "",
    "query_gateway/sql/execute.py": "",
    "query_gateway/sql/shape.py": "from query_gateway import state\n",
    "query_gateway/rules/policy.py": "from query_gateway.clients import identity\n",
    "query_gateway/app.py": "from query_gateway.sql import execute\n",  # the one import ignored
    "query_gateway/pipeline.py": "from query_gateway.sql import execute\n",
}


def test_issue31_the_check_fails_where_a_boundary_is_broken(tmp_path: Path) -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    for package in config["root_packages"]:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    for name, text in BROKEN_TREE.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(text)
    # the workspace's own contracts, word for word, over the tree (found first on the path)
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    done = _lint(tmp_path, {**os.environ, "PYTHONPATH": str(tmp_path)})
    assert done.returncode != 0
    assert f"Contracts: 0 kept, {len(CONTRACTS)} broken." in done.stdout, done.stdout + done.stderr
    assert "No cycles are allowed in audit_relay." in done.stdout
    assert "query_gateway.rules.policy -> query_gateway.clients" in done.stdout
    assert "query_gateway.sql.shape -> query_gateway.state" in done.stdout
    assert "query_gateway.pipeline -> query_gateway.sql.execute" in done.stdout
