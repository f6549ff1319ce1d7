"""RF-07: the plan-cache key is keyed by whose rows the plan is for, and reveals none of it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dataplane_contracts.ds import Organization
from dataplane_contracts.plans import ClaimCheck, Plan, PlanKeyInputs, plan_cache_key, plan_ttl

SECRET = b"0123456789abcdef-secret"
KEY_A = "pod:IT001E000000AA"
KEY_B = "pod:IT001E000000BB"


def _inputs(**kw: object) -> PlanKeyInputs:
    base: dict[str, object] = {
        "handler": "rec_registry",
        "table": "public.readings",
        "caller": None,
        "principals": (),
        "keys": (),
        "organizations": (),
        "args": {"column": "pod"},
    }
    base.update(kw)
    return PlanKeyInputs.model_validate(base)


def test_rf07_keys_differ_then_cache_keys_differ() -> None:
    a = plan_cache_key(_inputs(keys=(KEY_A,)), SECRET)
    b = plan_cache_key(_inputs(keys=(KEY_B,)), SECRET)
    assert a != b


def test_rf07_none_and_empty_principals_differ() -> None:
    assert plan_cache_key(_inputs(principals=None), SECRET) != plan_cache_key(_inputs(principals=()), SECRET)


@pytest.mark.parametrize(
    "change",
    [
        {"handler": "http_in_list"},
        {"table": "public.other"},
        {"caller": "sub-1"},
        {"principals": ("bob",)},
        {"organizations": (Organization(alias="rec-1"),)},
        {"args": {"column": "meter"}},
    ],
)
def test_rf07_every_input_enters_the_key(change: dict[str, object]) -> None:
    assert plan_cache_key(_inputs(), SECRET) != plan_cache_key(_inputs(**change), SECRET)


def test_rf07_order_of_keys_and_principals_does_not_matter() -> None:
    one = plan_cache_key(_inputs(keys=(KEY_A, KEY_B), principals=("a", "b")), SECRET)
    two = plan_cache_key(_inputs(keys=(KEY_B, KEY_A), principals=("b", "a")), SECRET)
    assert one == two


def test_rf07_secret_changes_the_key() -> None:
    assert plan_cache_key(_inputs(), SECRET) != plan_cache_key(_inputs(), b"another-secret-value")


def test_rf07_no_key_value_in_key_or_repr() -> None:
    inputs = _inputs(keys=(KEY_A,), principals=("alice@example.org",), caller="sub-secret")
    digest = plan_cache_key(inputs, SECRET)
    claim = ClaimCheck(
        handler="rec_registry",
        table="public.readings",
        principals=("alice@example.org",),
        keys=(KEY_A,),
    )
    for text in (digest, repr(inputs), str(inputs), repr(claim), str(claim)):
        assert "IT001E000000AA" not in text and "alice" not in text and "sub-secret" not in text
    assert len(digest) == 64 and int(digest, 16) >= 0


def test_rf07_claim_check_key_inputs_match() -> None:
    claim = ClaimCheck(handler="h", table="t", principals=None, keys=(KEY_A,), args={"column": "c"})
    assert plan_cache_key(claim.key_inputs(), SECRET) == plan_cache_key(
        _inputs(handler="h", table="t", principals=None, keys=(KEY_A,), args={"column": "c"}), SECRET
    )


def test_rf07_ttl_shortened_by_ds_and_token() -> None:
    assert plan_ttl(300, None, None, now=0) == 300
    assert plan_ttl(300, 60, None, now=0) == 60
    assert plan_ttl(300, 600, None, now=0) == 300
    assert plan_ttl(300, None, 100, now=40) == 60
    assert plan_ttl(300, None, 10, now=40) == 0
    assert plan_ttl(300, -5, None, now=0) == 0


def test_rf05_empty_allow_list_is_a_deny_never_in_empty() -> None:
    assert Plan.among("pod", []).kind == "deny"
    with pytest.raises(ValidationError):
        Plan(kind="in", column="pod", values=())
    plan = Plan.among("pod", ["IT001E000000AA", "IT001E000000BB"], key_type="pod")
    assert plan.meta.count == 2 and plan.meta.key_type == "pod"
    assert "IT001E" not in plan.meta.model_dump_json()
