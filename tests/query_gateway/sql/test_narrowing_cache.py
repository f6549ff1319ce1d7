"""The rewrite runs once per statement shape; the values are bound per request. One statement
text asked again under different plans must answer each plan's own rows, never a cached one's."""

from __future__ import annotations

from dataplane_contracts.plans import Plan
from dataplane_testing.sqlgw import Db, allow_all, pods

STATEMENT = "SELECT pod, count(*) AS n FROM readings GROUP BY pod ORDER BY pod"


async def _pods_seen(db: Db, plans: dict[str, list[Plan]]) -> list[str]:
    narrowed = db.narrow(STATEMENT, plans)
    page = await db.executor.run(narrowed, offset=0, limit=100, skip_count=True)
    return [str(row["pod"]) for row in page.items]


async def test_rf07_same_statement_different_allow_lists_never_share_rows(db: Db) -> None:
    assert await _pods_seen(db, pods("pod-1")) == ["pod-1"]
    assert await _pods_seen(db, pods("pod-2", "pod-3")) == ["pod-2", "pod-3"]
    assert await _pods_seen(db, pods("pod-1")) == ["pod-1"]


async def test_rf05_same_statement_deny_then_allow_all_then_allow_list(db: Db) -> None:
    denied = {**allow_all(), "readings": [Plan.deny(key_type="pod")]}
    assert await _pods_seen(db, denied) == []
    assert await _pods_seen(db, allow_all()) == ["pod-1", "pod-2", "pod-3", "pod-4"]
    assert await _pods_seen(db, pods("pod-4")) == ["pod-4"]
    assert await _pods_seen(db, denied) == []


async def test_same_shape_reuses_the_statement_with_new_parameters(db: Db) -> None:
    one = db.narrow(STATEMENT, pods("pod-1"))
    two = db.narrow(STATEMENT, pods("pod-2", "pod-3"))
    assert one.sql == two.sql  # one rewrite, verified once
    assert one.params != two.params
