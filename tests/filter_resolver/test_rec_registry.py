"""rec_registry through celine-sdk against the REC registry double: the handler's order, RF-05,
RF-11, RF-12 and the retries."""

from __future__ import annotations

import json
from typing import Any

import jwt
import pytest

from dataplane_local.infra import free_port
from dataplane_testing.resolver import CLIENT_ID, claim, person, service_account

NOT_A_MEMBER_DETAIL = "You are not a member of any community"
ARGS = {"column": "sensor_id"}

METERED = [
    {"key": "a1", "name": "Meter 1", "sensor_id": "POD-1"},
    {"key": "a2", "name": "Battery", "asset_type": "battery", "sensor_id": None},
    {"key": "a3", "name": "Meter 3", "sensor_id": "POD-3"},
]


def _args(doubles: Any) -> dict[str, Any]:
    return {**ARGS, "url": doubles.registry_url}


# ---- the order: delegated, service account, person ---------------------------------------------


async def test_person_narrows_to_their_metered_assets(harness: Any, fresh_doubles: Any) -> None:
    fresh_doubles.registry.set_member("alice", METERED)
    alice = person(fresh_doubles.issuer, "alice")
    plan = await harness.plan(claim("rec_registry", _args(fresh_doubles), caller=alice))
    assert plan.kind == "in"
    assert plan.column == "sensor_id"
    assert plan.values == ("POD-1", "POD-3")
    calls = fresh_doubles.registry.calls("user_assets")
    assert [c.headers["authorization"] for c in calls] == [f"Bearer {alice.token}"]


async def test_default_url_is_rec_registry_url(harness: Any, fresh_doubles: Any) -> None:
    fresh_doubles.registry.set_member("alice", METERED)
    plan = await harness.plan(claim("rec_registry", ARGS, caller=person(fresh_doubles.issuer, "alice")))
    assert plan.values == ("POD-1", "POD-3")


async def test_service_account_is_not_narrowed(harness: Any, fresh_doubles: Any) -> None:
    plan = await harness.plan(
        claim("rec_registry", _args(fresh_doubles), caller=service_account(fresh_doubles.issuer))
    )
    assert plan.kind == "all"
    assert fresh_doubles.registry.calls() == []


async def test_rf05_empty_principals_deny_without_calling(harness: Any, fresh_doubles: Any) -> None:
    before = fresh_doubles.issuer.token_requests
    # a service caller with principals=[]: the service-account bypass must never be reached
    check = claim(
        "rec_registry", _args(fresh_doubles), caller=service_account(fresh_doubles.issuer), principals=()
    )
    plan = await harness.plan(check)
    assert plan.kind == "deny"
    assert fresh_doubles.registry.calls() == []
    assert fresh_doubles.issuer.token_requests == before


async def test_rf05_delegated_lookup_on_the_service_identity(harness: Any, fresh_doubles: Any) -> None:
    fresh_doubles.registry.set_member("alice", METERED, user_id="u-alice")
    fresh_doubles.registry.set_member("bob", [{"key": "b1", "sensor_id": "POD-2"}], user_id="u-bob")
    caller = service_account(fresh_doubles.issuer)
    check = claim(
        "rec_registry", _args(fresh_doubles), caller=caller, principals=("u-alice", "u-bob", "u-nobody")
    )
    plan = await harness.plan(check)
    assert plan.kind == "in"
    assert set(plan.values) == {"POD-1", "POD-3", "POD-2"}
    (call,) = fresh_doubles.registry.calls("admin_lookup")
    assert call.body == {"user_ids": ["u-alice", "u-bob", "u-nobody"]}
    token = call.headers["authorization"].removeprefix("Bearer ")
    assert token != caller.token
    assert jwt.decode(token, options={"verify_signature": False})["azp"] == CLIENT_ID


async def test_rf05_delegated_members_without_meters_deny(harness: Any, fresh_doubles: Any) -> None:
    fresh_doubles.registry.set_member("carol", [{"key": "c1", "sensor_id": None}], user_id="u-carol")
    check = claim(
        "rec_registry",
        _args(fresh_doubles),
        caller=service_account(fresh_doubles.issuer),
        principals=("u-carol",),
    )
    assert (await harness.plan(check)).kind == "deny"


async def test_missing_column_is_invalid(harness: Any, fresh_doubles: Any) -> None:
    reply = await harness.resolve(claim("rec_registry", {}, caller=person(fresh_doubles.issuer, "alice")))
    assert (reply.outcome, reply.error_code) == ("error", "row_filter_invalid")


# ---- RF-11 --------------------------------------------------------------------------------------


async def test_rf11_member_with_no_assets_deny(harness: Any, fresh_doubles: Any) -> None:
    fresh_doubles.registry.set_member("dave", [])
    plan = await harness.plan(
        claim("rec_registry", _args(fresh_doubles), caller=person(fresh_doubles.issuer, "dave"))
    )
    assert plan.kind == "deny"
    assert plan.values == ()


async def test_rf11_assets_without_sensor_id_deny(harness: Any, fresh_doubles: Any) -> None:
    fresh_doubles.registry.set_member(
        "erin", [{"key": "e1", "sensor_id": None}, {"key": "e2", "sensor_id": ""}]
    )
    plan = await harness.plan(
        claim("rec_registry", _args(fresh_doubles), caller=person(fresh_doubles.issuer, "erin"))
    )
    assert plan.kind == "deny"


# ---- RF-12 --------------------------------------------------------------------------------------

DENY_ANSWERS = {
    "coded": {"detail": NOT_A_MEMBER_DETAIL, "code": "not_a_member"},
    "coded_reworded": {"detail": "No community membership on record", "code": "not_a_member"},
    "detail_only": {"detail": NOT_A_MEMBER_DETAIL},
    "detail_with_null_code": {"detail": NOT_A_MEMBER_DETAIL, "code": None},
}

ERROR_ANSWERS: dict[str, tuple[int, Any]] = {
    "403_other_code_beside_old_detail": (403, {"detail": NOT_A_MEMBER_DETAIL, "code": "forbidden"}),
    "403_code_not_exact": (403, {"detail": NOT_A_MEMBER_DETAIL, "code": "NOT_A_MEMBER"}),
    "403_code_not_a_string": (403, {"detail": NOT_A_MEMBER_DETAIL, "code": 7}),
    "403_detail_not_exact": (403, {"detail": NOT_A_MEMBER_DETAIL + "."}),
    "403_other_body": (403, {"detail": "Forbidden"}),
    "403_not_an_object": (403, [NOT_A_MEMBER_DETAIL]),
    "403_bare_from_a_proxy": (403, "<html><body>403 Forbidden</body></html>"),
    "403_empty": (403, ""),
    "401_with_the_code": (401, {"detail": NOT_A_MEMBER_DETAIL, "code": "not_a_member"}),
    "404_with_the_code": (404, {"detail": NOT_A_MEMBER_DETAIL, "code": "not_a_member"}),
    "500_with_the_code": (500, {"detail": NOT_A_MEMBER_DETAIL, "code": "not_a_member"}),
    "503": (503, {"detail": "unavailable"}),
    "200_unreadable": (200, "not json"),
    "200_without_items": (200, {"total": 0}),
}


def _fault(doubles: Any, status: int, body: Any) -> None:
    if isinstance(body, str):
        doubles.registry.set_fault(endpoint="user_assets", status=status, text=body)
    else:
        doubles.registry.set_fault(endpoint="user_assets", status=status, body=body)


@pytest.mark.parametrize("name", sorted(DENY_ANSWERS))
async def test_rf12_not_a_member_deny(harness: Any, fresh_doubles: Any, debug_logs: Any, name: str) -> None:
    _fault(fresh_doubles, 403, DENY_ANSWERS[name])
    frank = person(fresh_doubles.issuer, "frank")
    plan = await harness.plan(claim("rec_registry", _args(fresh_doubles), caller=frank))
    assert plan.kind == "deny"
    for secret in (frank.username, frank.sub, frank.token):
        assert secret not in debug_logs.text


async def test_rf12_unmocked_non_member_deny(harness: Any, fresh_doubles: Any) -> None:
    # the double's own answer for an unknown user, not a programmed fault
    plan = await harness.plan(
        claim("rec_registry", _args(fresh_doubles), caller=person(fresh_doubles.issuer, "gina"))
    )
    assert plan.kind == "deny"


@pytest.mark.parametrize("name", sorted(ERROR_ANSWERS))
async def test_rf12_any_other_answer_is_an_error(
    harness: Any, fresh_doubles: Any, debug_logs: Any, name: str
) -> None:
    status, body = ERROR_ANSWERS[name]
    _fault(fresh_doubles, status, body)
    fresh_doubles.registry.set_member("henry", METERED)  # would narrow if the fault were ignored
    reply = await harness.resolve(
        claim("rec_registry", _args(fresh_doubles), caller=person(fresh_doubles.issuer, "henry"))
    )
    assert (reply.outcome, reply.error_code) == ("error", "row_filter_unavailable")
    assert NOT_A_MEMBER_DETAIL not in (reply.error_detail or "")
    # a failure is logged with its status and code, never the registry's sentence
    failures = [r for r in debug_logs.records if "rec_registry_user_assets_failed" in r.getMessage()]
    assert failures, debug_logs.text
    assert all(f"'status': {status}" in r.getMessage() for r in failures)
    assert NOT_A_MEMBER_DETAIL not in debug_logs.text


async def test_rf12_unreachable_registry_is_an_error(harness: Any, fresh_doubles: Any) -> None:
    args = {**ARGS, "url": f"http://127.0.0.1:{free_port()}"}
    reply = await harness.resolve(claim("rec_registry", args, caller=person(fresh_doubles.issuer, "ivan")))
    assert (reply.outcome, reply.error_code) == ("error", "row_filter_unavailable")


async def test_rf12_member_200_on_the_wire_narrows(harness: Any, fresh_doubles: Any) -> None:
    body = {"items": [{"key": "k", "asset_type": "meter", "name": "M", "sensor_id": "POD-9"}], "total": 1}
    _fault(fresh_doubles, 200, body)
    plan = await harness.plan(
        claim("rec_registry", _args(fresh_doubles), caller=person(fresh_doubles.issuer, "judy"))
    )
    assert plan.values == ("POD-9",)


async def test_rf12_member_200_with_no_items_deny(harness: Any, fresh_doubles: Any) -> None:
    _fault(fresh_doubles, 200, {"items": [], "total": 0})
    plan = await harness.plan(
        claim("rec_registry", _args(fresh_doubles), caller=person(fresh_doubles.issuer, "judy"))
    )
    assert plan.kind == "deny"


# ---- retries ------------------------------------------------------------------------------------


async def test_retry_registry_failing_twice_then_answering_resolves(harness: Any, fresh_doubles: Any) -> None:
    fresh_doubles.registry.set_member("kate", METERED)
    fresh_doubles.registry.set_fault(endpoint="user_assets", status=503, count=2)
    plan = await harness.plan(
        claim("rec_registry", _args(fresh_doubles), caller=person(fresh_doubles.issuer, "kate"))
    )
    assert plan.values == ("POD-1", "POD-3")
    assert [c.status for c in fresh_doubles.registry.calls("user_assets")] == [503, 503, 200]


async def test_retry_registry_failing_every_attempt_is_unavailable(harness: Any, fresh_doubles: Any) -> None:
    fresh_doubles.registry.set_member("kate", METERED)
    fresh_doubles.registry.set_fault(endpoint="user_assets", status=502)
    reply = await harness.resolve(
        claim("rec_registry", _args(fresh_doubles), caller=person(fresh_doubles.issuer, "kate"))
    )
    assert (reply.outcome, reply.error_code) == ("error", "row_filter_unavailable")
    assert len(fresh_doubles.registry.calls("user_assets")) == 3


async def test_retry_delegated_lookup_failing_twice_then_answering(harness: Any, fresh_doubles: Any) -> None:
    fresh_doubles.registry.set_member("alice", METERED, user_id="u-alice")
    fresh_doubles.registry.set_fault(endpoint="admin_lookup", status=500, count=2)
    check = claim(
        "rec_registry",
        _args(fresh_doubles),
        caller=service_account(fresh_doubles.issuer),
        principals=("u-alice",),
    )
    assert (await harness.plan(check)).values == ("POD-1", "POD-3")


async def test_delegated_lookup_refused_is_an_error(harness: Any, fresh_doubles: Any) -> None:
    fresh_doubles.registry.set_fault(
        endpoint="admin_lookup", status=403, body={"detail": "x", "code": "forbidden"}
    )
    check = claim(
        "rec_registry",
        _args(fresh_doubles),
        caller=service_account(fresh_doubles.issuer),
        principals=("u-a",),
    )
    reply = await harness.resolve(check)
    assert (reply.outcome, reply.error_code) == ("error", "row_filter_unavailable")
    assert len(fresh_doubles.registry.calls("admin_lookup")) == 1  # a refusal is not retried


# ---- the SDK floor (RF-12 needs REQ-0132) ----------------------------------------------------------


def test_rf12_sdk_floor_is_pinned() -> None:
    import tomllib
    from importlib.metadata import version
    from pathlib import Path

    from celine.sdk.rec_registry import RecRegistryApiError, RecRegistryUserClient

    root = Path(__file__).resolve().parents[2]
    deps = tomllib.loads((root / "services/filter-resolver/pyproject.toml").read_text())["project"][
        "dependencies"
    ]
    assert "celine-sdk>=1.21.0" in deps
    installed = tuple(int(p) for p in version("celine-sdk").split(".")[:3])
    assert installed >= (1, 21, 0)
    err = RecRegistryApiError("x", status_code=403, body=b"{}", code="not_a_member", detail="d")
    assert (err.status_code, err.code, err.detail, err.body) == (403, "not_a_member", "d", b"{}")
    assert callable(RecRegistryUserClient.get_my_assets)


def test_rf12_raw_unexpected_status_is_not_read() -> None:
    from celine.sdk.openapi.rec_registry.errors import UnexpectedStatus
    from celine.sdk.rec_registry import RecRegistryApiError

    from filter_resolver.handlers.rec_registry import is_not_a_member

    body = json.dumps({"detail": NOT_A_MEMBER_DETAIL, "code": "not_a_member"}).encode()
    assert is_not_a_member(UnexpectedStatus(403, body)) is False
    code, detail = RecRegistryApiError.refusal_of(body)
    coded = RecRegistryApiError("x", status_code=403, body=body, code=code, detail=detail)
    assert is_not_a_member(coded) is True  # the same answer, through the SDK's own error
