"""The catalogue file and the built-in handler → binds table (GS-08)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from dataplane_contracts.catalogue import HANDLER_BINDS, Catalogue, load_catalogue


def _entry(person: dict[str, object] | None = None, organization: dict[str, object] | None = None) -> dict:
    layers: dict[str, object] = {}
    if person is not None:
        layers["person"] = person
    if organization is not None:
        layers["organization"] = organization
    return {"id": "energy.readings", "table": "public.readings", "row_filters": layers}


def test_catalogue_reads_dotted_ids_levels_and_layers(tmp_path: Path) -> None:
    path = tmp_path / "catalogue.yaml"
    path.write_text(
        """
datasets:
  - id: energy.readings
    table: public.readings
    access_level: restricted
    expose: true
    dataspace_expose: true
    row_filters:
      person: {handler: subject_key_match, args: {column: pod, key_type: pod}}
      organization: {handler: allow_all, binds: organization}
"""
    )
    cat = load_catalogue(path)
    entry = cat.by_id()["energy.readings"]
    assert entry.access_level == "restricted" and entry.expose and entry.dataspace_expose
    assert entry.row_filters.person is not None and entry.row_filters.person.column == "pod"


def test_gs08_builtin_binds_must_match_the_table() -> None:
    with pytest.raises(ValidationError, match=r"energy.readings.*person.*subject_key_match"):
        Catalogue.model_validate(
            {"datasets": [_entry(person={"handler": "subject_key_match", "binds": "organization"})]}
        )
    with pytest.raises(ValidationError, match="organization_match"):
        Catalogue.model_validate({"datasets": [_entry(person={"handler": "organization_match"})]})


def test_gs08_allow_all_and_plugins_must_declare_binds() -> None:
    with pytest.raises(ValidationError, match="must declare binds"):
        Catalogue.model_validate({"datasets": [_entry(person={"handler": "allow_all"})]})
    with pytest.raises(ValidationError, match="must declare binds"):
        Catalogue.model_validate({"datasets": [_entry(person={"handler": "my_plugin"})]})
    ok = Catalogue.model_validate({"datasets": [_entry(person={"handler": "my_plugin", "binds": "person"})]})
    assert ok.datasets[0].row_filters.person is not None


def test_catalogue_rejects_unknown_fields_and_levels() -> None:
    with pytest.raises(ValidationError):
        Catalogue.model_validate({"datasets": [{**_entry(), "colour": "red"}]})
    with pytest.raises(ValidationError):
        Catalogue.model_validate({"datasets": [{**_entry(), "access_level": "public"}]})
    with pytest.raises(ValidationError):
        Catalogue.model_validate({"datasets": [{**_entry(), "table": "readings; drop"}]})
    with pytest.raises(ValidationError):  # a trailing line break is not part of a name
        Catalogue.model_validate({"datasets": [{**_entry(), "table": "readings\n"}]})


def test_builtin_binds_table() -> None:
    assert HANDLER_BINDS["subject_key_match"] == "person"
    assert HANDLER_BINDS["organization_match"] == "organization"
    assert HANDLER_BINDS["member_wide"] == "organization"
    assert HANDLER_BINDS["allow_all"] is None


def test_binds_of_knows_the_builtins_and_the_plugins_the_catalogue_declares() -> None:
    cat = Catalogue.model_validate(
        {
            "datasets": [
                _entry(
                    person={"handler": "my_plugin", "binds": "person"},
                    organization={"handler": "member_wide"},
                )
            ]
        }
    )
    assert cat.binds_of("my_plugin") == "person"
    assert cat.binds_of("organization_match") == "organization"
    assert cat.binds_of("deny_all") is None
    assert cat.binds_of("their_plugin") == "unknown"


def test_columns_default_to_every_column_and_a_list_narrows_with_masks(tmp_path: Path) -> None:
    """Issue 15: no `columns:` is every column (catalogues written before it stay valid); a list
    names the exposed columns, a bare name or `{name, mask}` with mask `null` or `hash`."""
    assert Catalogue.model_validate({"datasets": [_entry()]}).datasets[0].columns is None
    path = tmp_path / "catalogue.yaml"
    path.write_text(
        """
datasets:
  - id: energy.readings
    table: public.readings
    columns:
      - id
      - {name: pod, mask: hash}
      - name: owner
        mask: 'null'
"""
    )
    entry = load_catalogue(path).datasets[0]
    listed = [(c.name, c.mask) for c in entry.columns or ()]
    assert listed == [("id", "none"), ("pod", "hash"), ("owner", "null")]
    assert entry.masks == {"pod": "hash", "owner": "null"}


@pytest.mark.parametrize(
    ("columns", "why"),
    [
        ([], "at least 1"),
        (["id", "id"], "more than once"),
        ([{"name": "id", "mask": None}], "write mask: 'null'"),  # YAML's bare `mask: null`
        ([{"name": "id", "mask": "md5"}], "'null' or 'hash'|'none'"),
        ([{"name": "id", "masked": "hash"}], "Extra inputs"),
        ([{"name": ""}], "at least 1"),
        ([7], "valid dictionary"),
    ],
)
def test_a_columns_list_is_refused_when_it_is_not_a_list_of_distinct_columns(
    columns: list[object], why: str
) -> None:
    with pytest.raises(ValidationError, match=why):
        Catalogue.model_validate({"datasets": [{**_entry(), "columns": columns}]})


def test_gs14_qe07_limits_are_optional_and_strict() -> None:
    """`max_rows` and `rate_limit` default to none (a catalogue written before them reads as it
    did); a value that cannot be meant is refused, as is a field the bucket does not take."""
    entry = Catalogue.model_validate({"datasets": [_entry()]}).datasets[0]
    assert (entry.max_rows, entry.rate_limit) == (None, None)
    limited = {**_entry(), "max_rows": 50, "rate_limit": {"per_second": 0.5, "burst": 3}}
    entry = Catalogue.model_validate({"datasets": [limited]}).datasets[0]
    assert entry.max_rows == 50 and entry.rate_limit is not None
    assert (entry.rate_limit.per_second, entry.rate_limit.burst) == (0.5, 3)
    for wrong in (
        {"max_rows": 0},
        {"rate_limit": {"per_second": 0, "burst": 1}},
        {"rate_limit": {"per_second": 1, "burst": 0}},
        {"rate_limit": {"per_second": 1}},
        {"rate_limit": {"per_second": 1, "burst": 1, "window": 60}},
    ):
        with pytest.raises(ValidationError):
            Catalogue.model_validate({"datasets": [{**_entry(), **wrong}]})
