"""Shared data and helpers of the SQL-layer tests: three small tables (one in another schema, its
name in mixed case), their catalogue, plan builders, and a handle on a seeded database."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import asyncpg

from dataplane_contracts.catalogue import Catalogue
from dataplane_contracts.plans import Plan
from query_gateway.sql import (
    ColumnTypes,
    NarrowedQuery,
    QueryExecutor,
    QueryPage,
    narrow_query,
    validate_query,
)

PODS = ("pod-1", "pod-2", "pod-3", "pod-4")
ORGS = ("org-a", "org-b")
SITE_UUIDS = (
    "5b7e7f5c-1111-4a4a-9b9b-000000000001",
    "5b7e7f5c-2222-4a4a-9b9b-000000000002",
    "5b7e7f5c-3333-4a4a-9b9b-000000000003",
    "5b7e7f5c-4444-4a4a-9b9b-000000000004",
)

# id, pod, value, org
READINGS = [(i, PODS[i % 4], (i * 7) % 23, ORGS[(i // 4) % 2]) for i in range(1, 33)]
# pod, kind, org (pod-5 exists only here)
METERS = [(p, "k1" if n % 2 else "k2", ORGS[n % 2]) for n, p in enumerate((*PODS, "pod-5"))]
# site_id, site_uuid, pod, name
SITES = [(n + 1, u, PODS[n % 4], f"site {n + 1}") for n, u in enumerate(SITE_UUIDS)]

SCHEMA_A = """
CREATE TABLE public.readings (id integer PRIMARY KEY, pod text NOT NULL, value integer NOT NULL,
                              org text NOT NULL);
CREATE TABLE public.meters (pod text PRIMARY KEY, kind text NOT NULL, org text NOT NULL);
CREATE SCHEMA energy;
CREATE TABLE energy."Sites" (site_id integer PRIMARY KEY, site_uuid uuid NOT NULL, pod text NOT NULL,
                             name text NOT NULL);
"""

CATALOGUE = Catalogue.model_validate(
    {
        "datasets": [
            {
                "id": "readings",
                "table": "public.readings",
                "row_filters": {
                    "person": {"handler": "subject_key_match", "args": {"column": "pod", "key_type": "pod"}},
                    "organization": {"handler": "organization_match", "args": {"column": "org"}},
                },
            },
            {
                "id": "grid.meters",
                "table": "meters",
                "row_filters": {
                    "person": {"handler": "subject_key_match", "args": {"column": "pod", "key_type": "pod"}},
                    "organization": {"handler": "member_wide"},
                },
            },
            {
                "id": "ops.sites",
                "table": 'energy."Sites"',
                "row_filters": {
                    "person": {
                        "handler": "direct_user_match",
                        "args": {"column": "site_uuid"},
                    },
                    "organization": {"handler": "member_wide"},
                },
            },
        ]
    }
)


async def seed(conn: asyncpg.Connection, readings: str, meters: str, sites: str) -> None:
    await conn.executemany(f"INSERT INTO {readings} VALUES ($1, $2, $3, $4)", READINGS)
    await conn.executemany(f"INSERT INTO {meters} VALUES ($1, $2, $3)", METERS)
    await conn.executemany(
        f"INSERT INTO {sites} VALUES ($1, $2::uuid, $3, $4)", [(a, b, c, d) for a, b, c, d in SITES]
    )


@dataclass
class Db:
    url: str
    pool: asyncpg.Pool
    columns: ColumnTypes
    executor: QueryExecutor

    async def query(
        self,
        sql: str,
        plans: Mapping[str, Sequence[Plan]],
        *,
        offset: int = 0,
        limit: int = 10_000,
        skip_count: bool = False,
        catalogue: Catalogue = CATALOGUE,
    ) -> QueryPage:
        narrowed = self.narrow(sql, plans, catalogue=catalogue)
        return await self.executor.run(narrowed, offset=offset, limit=limit, skip_count=skip_count)

    def narrow(
        self, sql: str, plans: Mapping[str, Sequence[Plan]], *, catalogue: Catalogue = CATALOGUE
    ) -> NarrowedQuery:
        return narrow_query(validate_query(sql, catalogue), catalogue, plans, self.columns)


def allow_all() -> dict[str, list[Plan]]:
    return {d.id: [] for d in CATALOGUE.datasets}


def pods(*values: str) -> dict[str, list[Plan]]:
    """Readings and meters narrowed to these pods; sites unfiltered."""
    return {
        "readings": [Plan.among("pod", list(values), key_type="pod", label="pod keys")],
        "grid.meters": [Plan.among("pod", list(values), key_type="pod", label="pod keys")],
        "ops.sites": [],
    }
