"""table_pointer reads the pointer table itself, over a read-only connection to the datasets
database; identifiers validated and quoted, the subject bound as a parameter."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from dataplane_testing.resolver import claim, person

ARGS = {"column": "meter_id", "pointer_table": "ptr.user_meters", "pointer_key_column": "meter"}


@pytest.fixture
async def datasets(fresh_database: str) -> AsyncIterator[str]:
    conn = await asyncpg.connect(fresh_database)
    try:
        await conn.execute(
            """
            CREATE SCHEMA ptr;
            CREATE TABLE ptr.user_meters (user_id text, owner text, meter text);
            CREATE TABLE public.numbers (user_id text, n integer);
            """
        )
    finally:
        await conn.close()
    yield fresh_database


async def _rows(url: str, table: str, rows: list[tuple[Any, ...]]) -> None:
    conn = await asyncpg.connect(url)
    try:
        cols = "(user_id, owner, meter)" if table == "ptr.user_meters" else "(user_id, n)"
        marks = ", ".join(f"${i + 1}" for i in range(len(rows[0])))
        await conn.executemany(f"INSERT INTO {table} {cols} VALUES ({marks})", rows)
    finally:
        await conn.close()


async def test_reads_the_callers_pointers(make_harness: Any, fresh_doubles: Any, datasets: str) -> None:
    al = person(fresh_doubles.issuer, "al")
    bo = person(fresh_doubles.issuer, "bo")
    await _rows(
        datasets,
        "ptr.user_meters",
        [(al.sub, "x", "M-2"), (al.sub, "x", "M-1"), (bo.sub, "x", "M-9"), (al.sub, "x", None)],
    )
    async with make_harness(datasets_database_url=datasets) as h:
        plan = await h.plan(claim("table_pointer", ARGS, caller=al))
    assert (plan.kind, plan.column, plan.values) == ("in", "meter_id", ("M-1", "M-2"))


async def test_pointer_subject_column(make_harness: Any, fresh_doubles: Any, datasets: str) -> None:
    al = person(fresh_doubles.issuer, "al")
    await _rows(datasets, "ptr.user_meters", [("other", al.sub, "M-5"), (al.sub, "other", "M-6")])
    async with make_harness(datasets_database_url=datasets) as h:
        plan = await h.plan(claim("table_pointer", {**ARGS, "pointer_subject_column": "owner"}, caller=al))
    assert plan.values == ("M-5",)


async def test_typed_values(make_harness: Any, fresh_doubles: Any, datasets: str) -> None:
    al = person(fresh_doubles.issuer, "al")
    await _rows(datasets, "public.numbers", [(al.sub, 3), (al.sub, 1)])
    args = {"column": "n", "pointer_table": "numbers", "pointer_key_column": "n"}
    async with make_harness(datasets_database_url=datasets) as h:
        plan = await h.plan(claim("table_pointer", args, caller=al))
    assert plan.values == (1, 3)


async def test_no_pointers_deny(make_harness: Any, fresh_doubles: Any, datasets: str) -> None:
    async with make_harness(datasets_database_url=datasets) as h:
        plan = await h.plan(claim("table_pointer", ARGS, caller=person(fresh_doubles.issuer, "al")))
    assert plan.kind == "deny"


async def test_subject_is_bound_not_spliced(make_harness: Any, fresh_doubles: Any, datasets: str) -> None:
    sly = person(fresh_doubles.issuer, "sly").model_copy(update={"sub": "x' OR '1'='1"})
    await _rows(datasets, "ptr.user_meters", [("victim", "x", "M-1"), (sly.sub, "x", "M-7")])
    async with make_harness(datasets_database_url=datasets) as h:
        plan = await h.plan(claim("table_pointer", ARGS, caller=sly))
    assert plan.values == ("M-7",)


@pytest.mark.parametrize(
    "fields",
    [{"principals": ()}, {"principals": ("u",)}, {"keys": ("pod:1",)}],
    ids=["empty", "named", "keys"],
)
async def test_refuses_delegation(make_harness: Any, fresh_doubles: Any, datasets: str, fields: Any) -> None:
    async with make_harness(datasets_database_url=datasets) as h:
        reply = await h.resolve(
            claim("table_pointer", ARGS, caller=person(fresh_doubles.issuer, "al"), **fields)
        )
    assert (reply.outcome, reply.error_code) == ("error", "row_filter_unenforceable")


@pytest.mark.parametrize(
    "args",
    [
        {**ARGS, "pointer_table": 'ptr.user_meters"; DROP TABLE x; --'},
        {**ARGS, "pointer_key_column": "meter)"},
        {**ARGS, "pointer_subject_column": "user id"},
        {**ARGS, "pointer_key_column": "meter\n"},
        {**ARGS, "pointer_table": "a.b.c"},
        {**ARGS, "pointer_table": "ptr.missing"},
        {k: v for k, v in ARGS.items() if k != "pointer_key_column"},
        {k: v for k, v in ARGS.items() if k != "column"},
    ],
    ids=[
        "table_injection",
        "column_injection",
        "subject_space",
        "trailing_line_break",
        "three_parts",
        "missing_table",
        "no_key",
        "no_col",
    ],
)
async def test_invalid_args(make_harness: Any, fresh_doubles: Any, datasets: str, args: Any) -> None:
    async with make_harness(datasets_database_url=datasets) as h:
        reply = await h.resolve(claim("table_pointer", args, caller=person(fresh_doubles.issuer, "al")))
    assert (reply.outcome, reply.error_code) == ("error", "row_filter_invalid")


async def test_connection_is_read_only(make_harness: Any, fresh_doubles: Any, datasets: str) -> None:
    async with make_harness(datasets_database_url=datasets) as h:
        pool = await h.runtime.pool.get()
        assert pool is not None
        with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
            await pool.execute("INSERT INTO ptr.user_meters VALUES ('a', 'b', 'c')")


async def test_without_datasets_database_unavailable(harness: Any, fresh_doubles: Any) -> None:
    reply = await harness.resolve(claim("table_pointer", ARGS, caller=person(fresh_doubles.issuer, "al")))
    assert (reply.outcome, reply.error_code) == ("error", "row_filter_unavailable")


async def test_unreachable_database_unavailable_after_retries(make_harness: Any, fresh_doubles: Any) -> None:
    from dataplane_local.infra import free_port

    async with make_harness(datasets_database_url=f"postgresql://postgres@127.0.0.1:{free_port()}/x") as h:
        reply = await h.resolve(claim("table_pointer", ARGS, caller=person(fresh_doubles.issuer, "al")))
    assert (reply.outcome, reply.error_code) == ("error", "row_filter_unavailable")
    assert "3 attempts" in (reply.error_detail or "")
