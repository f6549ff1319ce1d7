"""GS-09 at start-up, and the reading of each column's type for the parameter casts."""

from __future__ import annotations

import pytest

from dataplane_contracts.catalogue import Catalogue
from dataplane_testing.sqlgw import CATALOGUE, Db
from query_gateway.sql import CatalogueMismatch, load_column_types
from query_gateway.sql.columns import convert_values


async def test_column_types_are_read_for_every_catalogued_table(db: Db) -> None:
    assert db.columns["public.readings"] == {
        "id": "integer",
        "pod": "text",
        "value": "integer",
        "org": "text",
    }
    assert db.columns['energy."Sites"']["site_uuid"] == "uuid"
    assert set(db.columns) == {d.table for d in CATALOGUE.datasets}


async def test_gs09_missing_filter_column_names_dataset_filter_and_column(db: Db) -> None:
    entry = CATALOGUE.by_id()["grid.meters"].model_dump()
    entry["row_filters"]["person"]["args"]["column"] = "missing_col"
    with pytest.raises(CatalogueMismatch) as err:
        await load_column_types(db.pool, Catalogue.model_validate({"datasets": [entry]}))
    message = str(err.value)
    assert "grid.meters" in message and "row_filters.person" in message and "subject_key_match" in message
    assert "missing_col" in message


async def test_gs09_organization_layer_column_is_checked_too(db: Db) -> None:
    entry = CATALOGUE.by_id()["readings"].model_dump()
    entry["row_filters"]["organization"]["args"]["column"] = "Org"  # case matters for a column name
    with pytest.raises(CatalogueMismatch, match=r"row_filters\.organization .*Org"):
        await load_column_types(db.pool, Catalogue.model_validate({"datasets": [entry]}))


async def test_gs09_missing_table_is_named(db: Db) -> None:
    entry = {**CATALOGUE.by_id()["grid.meters"].model_dump(), "table": "public.nowhere"}
    with pytest.raises(CatalogueMismatch, match=r"grid\.meters: table public\.nowhere"):
        await load_column_types(db.pool, Catalogue.model_validate({"datasets": [entry]}))


@pytest.mark.parametrize(
    ("pg_type", "values", "expected"),
    [
        ("integer", (1, "2", " 3 ", "x", 1.5, True, 2**31, "1"), [1, 2, 3]),
        ("smallint", (40000, 7), [7]),
        ("bigint", (2**63, -(2**63), "9223372036854775807"), [-(2**63), 2**63 - 1]),
        (
            "uuid",
            ("5B7E7F5C-1111-4A4A-9B9B-000000000001", "{5b7e7f5c-1111-4a4a-9b9b-000000000001}", "x", 7),
            ["5b7e7f5c-1111-4a4a-9b9b-000000000001"],
        ),
        ("text", ("a", 5, True, "b\x00"), ["a", "5"]),
        ("boolean", ("true", "f", "maybe"), [True, False]),
        ("date", ("2024-01-02", "2024-13-01"), ["2024-01-02"]),
        ("numeric", ("1.50", "nan", "abc"), ["1.50"]),
    ],
)
def test_values_convert_to_the_column_type_or_are_dropped(
    pg_type: str, values: tuple[object, ...], expected: list[object]
) -> None:
    assert [str(v) for v in convert_values(values, pg_type)] == [str(v) for v in expected]
