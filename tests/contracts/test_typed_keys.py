"""RF-03: typed data keys."""

from __future__ import annotations

from dataplane_contracts.keys import TypedKey, split_key, values_of_type


def test_rf03_split_at_first_colon() -> None:
    assert split_key("pod:IT:001") == TypedKey("pod", "IT:001")
    assert split_key("meter-id_2:abc") == TypedKey("meter-id_2", "abc")


def test_rf03_malformed_keys_are_skipped_not_fatal() -> None:
    for bad in ["POD:x", "pod:", ":x", "pod", "1pod:x", "pod:has space", "a" * 33 + ":x", None, 5]:
        assert split_key(bad) is None
    # a trailing line break is not part of the grammar: a `$`-anchored match would accept it
    for bad in ["pod:x\n", "pod:x\r\n", "\npod:x"]:
        assert split_key(bad) is None
    assert values_of_type(["pod:b", "bad", "pod:a", "pod:b", "meter:c", "pod: x"], "pod") == ["a", "b"]


def test_rf03_other_types_are_not_ours() -> None:
    assert values_of_type(["meter:1", "pod:2"], "pod") == ["2"]
    assert values_of_type(["meter:1"], "pod") == []
