"""RF-01, RF-02, RF-10: the row filter travels whole, is read strictly, and names subjects by DID."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dataplane_contracts.ds import DataplaneRowFilter, DecisionEnvelope

PRINCIPAL = "alice@example.org"
KEY = "pod:IT001E00000001"


def test_rf01_filter_carries_all_five_fields() -> None:
    f = DataplaneRowFilter.model_validate(
        {
            "handler": "subject_key_match",
            "args": {"column": "pod", "key_type": "pod"},
            "principals": [PRINCIPAL],
            "keys": [KEY],
            "subject_dids": ["did:web:alice.example"],
        }
    )
    assert (f.handler, f.args, f.principals, f.keys, f.subject_dids) == (
        "subject_key_match",
        {"column": "pod", "key_type": "pod"},
        [PRINCIPAL],
        [KEY],
        ["did:web:alice.example"],
    )


def test_rf02_unknown_field_refused() -> None:
    with pytest.raises(ValidationError):
        DataplaneRowFilter.model_validate({"handler": "subject_key_match", "column": "pod"})


def test_rf02_only_handler_is_required() -> None:
    with pytest.raises(ValidationError):
        DataplaneRowFilter.model_validate({"args": {}})
    f = DataplaneRowFilter.model_validate({"handler": "allow_all"})
    assert (f.args, f.principals, f.keys, f.subject_dids) == ({}, [], [], [])


def test_rf02_envelope_is_lenient_and_filters_parse_only_on_demand() -> None:
    env = DecisionEnvelope.model_validate(
        {
            "decision": "allow",
            "new_envelope_field": {"x": 1},
            "datasets": [
                {"dataset_id": "a", "decision": "allow", "row_filter": {"handler": "h", "bogus": 1}},
                {"dataset_id": "b", "decision": "allow", "row_filter": {"handler": "allow_all"}, "extra": 2},
            ],
            "decision_ref": "",
        }
    )
    assert env.allowed
    assert env.decision_ref is None  # an empty ref is dropped, not kept
    b = env.verdict_for("b")
    assert b is not None and b.parse_row_filter() == DataplaneRowFilter(handler="allow_all")
    a = env.verdict_for("a")
    assert a is not None
    with pytest.raises(ValidationError):
        a.parse_row_filter()


def test_rf01_organizations_read_leniently() -> None:
    env = DecisionEnvelope.model_validate(
        {
            "decision": "allow",
            "datasets": [
                {
                    "dataset_id": "a",
                    "organizations": [
                        "rec-one",
                        {"alias": "dso-two", "type": "dso"},
                        {"id": "rec-three", "types": ["rec", 5]},
                        {"name": "no alias"},
                        7,
                    ],
                }
            ],
        }
    )
    orgs = env.datasets[0].organizations
    assert orgs is not None
    assert [(o.alias, o.types) for o in orgs] == [
        ("rec-one", ()),
        ("dso-two", ("dso",)),
        ("rec-three", ("rec",)),
    ]


def test_rf10_subject_dids_default_empty_and_must_be_dids() -> None:
    assert DataplaneRowFilter(handler="x").subject_dids == []
    with pytest.raises(ValidationError) as err:
        DataplaneRowFilter.model_validate({"handler": "x", "subject_dids": [PRINCIPAL]})
    assert PRINCIPAL not in str(err.value) and PRINCIPAL not in repr(err.value)
    with pytest.raises(ValidationError):  # a DID followed by a line break is not a DID
        DataplaneRowFilter.model_validate({"handler": "x", "subject_dids": ["did:web:alice.example\n"]})


def test_rf08_repr_carries_no_principal_or_key() -> None:
    f = DataplaneRowFilter(handler="subject_key_match", principals=[PRINCIPAL], keys=[KEY])
    for text in (repr(f), str(f), f"{f}"):
        assert PRINCIPAL not in text and KEY not in text
