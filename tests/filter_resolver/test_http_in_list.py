"""http_in_list against a real HTTP endpoint double: every argument, the placeholders, the
delegation refusal and the retries."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dataplane_testing.resolver import claim, person


def retries_of(harness: Any) -> float:
    """Retries the resolver counted for http_in_list (its own metric; none yet reads as 0)."""
    value = harness.metrics.registry.get_sample_value(
        "filter_resolver_upstream_retries_total", {"handler": "http_in_list"}
    )
    return float(value or 0.0)


def _args(doubles: Any, path: str = "/allowed", **more: Any) -> dict[str, Any]:
    return {"column": "meter_id", "url": doubles.endpoint_url + path, **more}


async def test_get_list_narrows(harness: Any, fresh_doubles: Any) -> None:
    fresh_doubles.endpoint.reset((200, ["m-2", "m-1", "m-2", None]))
    plan = await harness.plan(
        claim("http_in_list", _args(fresh_doubles), caller=person(fresh_doubles.issuer, "al"))
    )
    assert (plan.kind, plan.column, plan.values) == ("in", "meter_id", ("m-2", "m-1"))
    (seen,) = fresh_doubles.endpoint.calls()
    assert seen.method == "GET"
    assert "authorization" not in seen.headers  # the token is forwarded only when asked


async def test_placeholders_in_url_params_headers(harness: Any, fresh_doubles: Any) -> None:
    fresh_doubles.endpoint.reset((200, ["x"]))
    al = person(fresh_doubles.issuer, "al", email="al@example.org")
    args = _args(
        fresh_doubles,
        "/users/{sub}/meters",
        params={"who": "{username}", "mail": "{email}", "fixed": 3},
        headers={"x-user": "{username}", "x-token": "t={token}"},
    )
    await harness.plan(claim("http_in_list", args, caller=al))
    (seen,) = fresh_doubles.endpoint.calls()
    assert seen.path == f"/users/{al.sub}/meters"
    assert seen.query == {"who": "al", "mail": "al@example.org", "fixed": "3"}
    assert seen.headers["x-user"] == "al"
    assert seen.headers["x-token"] == f"t={al.token}"


async def test_post_json_template_and_response_path(harness: Any, fresh_doubles: Any) -> None:
    fresh_doubles.endpoint.reset((200, {"data": {"items": [7, 3, True, 2.5]}}))
    al = person(fresh_doubles.issuer, "al")
    args = _args(
        fresh_doubles,
        method="post",
        json={"subject": "{sub}", "filters": [{"user": "{username}"}], "literal": "{not_a_placeholder}"},
        response_path="$.data.items",
    )
    plan = await harness.plan(claim("http_in_list", args, caller=al))
    assert plan.values == (7, 3, True, 2.5)  # numbers and booleans keep their types
    (seen,) = fresh_doubles.endpoint.calls()
    assert seen.method == "POST"
    assert json.loads(seen.body) == {
        "subject": al.sub,
        "filters": [{"user": "al"}],
        "literal": "{not_a_placeholder}",
    }


async def test_scalar_answer_is_one_item(harness: Any, fresh_doubles: Any) -> None:
    fresh_doubles.endpoint.reset((200, {"meter": "m-9"}))
    args = _args(fresh_doubles, response_path="meter")
    plan = await harness.plan(claim("http_in_list", args, caller=person(fresh_doubles.issuer, "al")))
    assert plan.values == ("m-9",)


async def test_max_items_truncates(harness: Any, fresh_doubles: Any) -> None:
    fresh_doubles.endpoint.reset((200, [f"m-{i}" for i in range(10)]))
    args = _args(fresh_doubles, max_items=3)
    plan = await harness.plan(claim("http_in_list", args, caller=person(fresh_doubles.issuer, "al")))
    assert plan.values == ("m-0", "m-1", "m-2")


async def test_empty_means_deny_by_default(harness: Any, fresh_doubles: Any) -> None:
    fresh_doubles.endpoint.reset((200, []))
    plan = await harness.plan(
        claim("http_in_list", _args(fresh_doubles), caller=person(fresh_doubles.issuer, "al"))
    )
    assert plan.kind == "deny"


async def test_empty_means_deny_false_is_no_predicate(harness: Any, fresh_doubles: Any) -> None:
    fresh_doubles.endpoint.reset((200, [None]))
    args = _args(fresh_doubles, empty_means_deny=False)
    plan = await harness.plan(claim("http_in_list", args, caller=person(fresh_doubles.issuer, "al")))
    assert plan.kind == "all"


async def test_forward_token(harness: Any, fresh_doubles: Any) -> None:
    fresh_doubles.endpoint.reset((200, ["m"]))
    al = person(fresh_doubles.issuer, "al")
    await harness.plan(claim("http_in_list", _args(fresh_doubles, forward_token=True), caller=al))
    (seen,) = fresh_doubles.endpoint.calls()
    assert seen.headers["authorization"] == f"Bearer {al.token}"


async def test_forward_token_replaces_a_configured_authorization(harness: Any, fresh_doubles: Any) -> None:
    fresh_doubles.endpoint.reset((200, ["m"]))
    al = person(fresh_doubles.issuer, "al")
    args = _args(fresh_doubles, forward_token=True, headers={"Authorization": "Basic c3ZjOnB3"})
    await harness.plan(claim("http_in_list", args, caller=al))
    (seen,) = fresh_doubles.endpoint.calls()
    assert [v for k, v in seen.header_items if k == "authorization"] == [f"Bearer {al.token}"]


@pytest.mark.parametrize(
    "fields",
    [{"principals": ()}, {"principals": ("u-1",)}, {"keys": ("pod:IT001",)}],
    ids=["empty_principals", "principals", "keys"],
)
async def test_refuses_delegation(harness: Any, fresh_doubles: Any, fields: dict[str, Any]) -> None:
    check = claim("http_in_list", _args(fresh_doubles), caller=person(fresh_doubles.issuer, "al"), **fields)
    reply = await harness.resolve(check)
    assert (reply.outcome, reply.error_code) == ("error", "row_filter_unenforceable")
    assert fresh_doubles.endpoint.calls() == []


@pytest.mark.parametrize(
    "args",
    [
        {"url": "http://127.0.0.1:9/x"},
        {"column": "c"},
        {"column": "c", "url": "http://127.0.0.1:9/x", "method": "PUT"},
        {"column": "c", "url": "http://127.0.0.1:9/x", "max_items": 0},
        {"column": "c", "url": "http://127.0.0.1:9/x", "empty_means_deny": "no"},
        {"column": "c", "url": "http://127.0.0.1:9/x", "headers": ["a"]},
        {"column": "c", "url": "not-a-url/{username}"},
    ],
    ids=["no_column", "no_url", "bad_method", "bad_max_items", "bad_flag", "bad_headers", "bad_url"],
)
async def test_invalid_args(harness: Any, fresh_doubles: Any, args: dict[str, Any]) -> None:
    reply = await harness.resolve(claim("http_in_list", args, caller=person(fresh_doubles.issuer, "al")))
    assert (reply.outcome, reply.error_code) == ("error", "row_filter_invalid")


# Each of these reaches a live endpoint double if it is not refused first: an argument that cannot
# make a request is a filter that cannot be applied (500 row_filter_invalid), found before any
# call. Left to the HTTP client it failed there and read as an outage (row_filter_unavailable),
# retried though no attempt could succeed.
UNUSABLE_ARGS: dict[str, dict[str, Any]] = {
    "header_number": {"headers": {"x-tenant": 3}},
    "header_float": {"headers": {"x-ratio": 0.5}},
    "header_bool": {"headers": {"x-flag": True}},
    "header_null": {"headers": {"x-none": None}},
    "header_list": {"headers": {"x-list": ["a"]}},
    "header_name_with_space": {"headers": {"x user": "a"}},
    "header_value_line_break": {"headers": {"x-user": "a\r\nx-injected: 1"}},
    "headers_not_a_mapping": {"headers": "x-user: a"},
    "param_mapping": {"params": {"filter": {"user": "{sub}"}}},
    "param_null": {"params": {"who": None}},
    "param_list_of_mappings": {"params": {"who": [{"a": 1}]}},
    "params_not_a_mapping": {"params": ["who"]},
    "method_number": {"method": 1},
    "timeout_string": {"timeout_seconds": "5"},
    "timeout_zero": {"timeout_seconds": 0},
    "timeout_negative": {"timeout_seconds": -1},
    "timeout_bool": {"timeout_seconds": True},
    "max_items_fraction": {"max_items": 2.5},
    "max_items_string": {"max_items": "10"},
    "max_items_bool": {"max_items": True},
    "response_path_number": {"response_path": 3},
    "forward_token_string": {"forward_token": "yes"},
    "column_number": {"column": 7},
}


@pytest.mark.parametrize("more", list(UNUSABLE_ARGS.values()), ids=list(UNUSABLE_ARGS))
async def test_unusable_arg_is_row_filter_invalid_never_an_outage(
    harness: Any, fresh_doubles: Any, more: dict[str, Any]
) -> None:
    fresh_doubles.endpoint.reset((200, ["m-1"]))
    reply = await harness.resolve(
        claim("http_in_list", _args(fresh_doubles, **more), caller=person(fresh_doubles.issuer, "al"))
    )
    assert (reply.outcome, reply.error_code) == ("error", "row_filter_invalid"), reply
    assert fresh_doubles.endpoint.calls() == []
    assert retries_of(harness) == 0


@pytest.mark.parametrize(
    "url", ["ftp://127.0.0.1/list", "http:///list", "http://[::1/list"], ids=["ftp", "no_host", "bad_host"]
)
async def test_url_that_is_not_http_is_row_filter_invalid(harness: Any, fresh_doubles: Any, url: str) -> None:
    args = {"column": "c", "url": url}
    reply = await harness.resolve(claim("http_in_list", args, caller=person(fresh_doubles.issuer, "al")))
    assert (reply.outcome, reply.error_code) == ("error", "row_filter_invalid"), reply


async def test_header_filled_with_non_ascii_identity_is_invalid_and_not_quoted(
    harness: Any, fresh_doubles: Any
) -> None:
    # the template is a string, but the caller's name makes it one httpx cannot send: still the
    # filter's problem for this caller, never an outage; the detail does not quote the name (RF-08)
    jose = person(fresh_doubles.issuer, "josé")
    reply = await harness.resolve(
        claim("http_in_list", _args(fresh_doubles, headers={"x-user": "{username}"}), caller=jose)
    )
    assert (reply.outcome, reply.error_code) == ("error", "row_filter_invalid"), reply
    assert "josé" not in (reply.error_detail or "")
    assert fresh_doubles.endpoint.calls() == []


async def test_params_scalars_and_lists_are_sent(harness: Any, fresh_doubles: Any) -> None:
    fresh_doubles.endpoint.reset((200, ["m-1"]))
    al = person(fresh_doubles.issuer, "al")
    params = {"ids": [1, "{username}", 2.5], "active": True, "n": 3}
    await harness.plan(claim("http_in_list", _args(fresh_doubles, params=params), caller=al))
    (seen,) = fresh_doubles.endpoint.calls()
    assert seen.query_items == [("ids", "1"), ("ids", "al"), ("ids", "2.5"), ("active", "true"), ("n", "3")]


async def test_whole_number_max_items_and_integer_timeout_are_accepted(
    harness: Any, fresh_doubles: Any
) -> None:
    # JSON has one number type: 2.0 items is two items, a timeout of 5 is 5 seconds
    fresh_doubles.endpoint.reset((200, ["m-1", "m-2", "m-3"]))
    args = _args(fresh_doubles, max_items=2.0, timeout_seconds=5)
    plan = await harness.plan(claim("http_in_list", args, caller=person(fresh_doubles.issuer, "al")))
    assert plan.values == ("m-1", "m-2")


async def test_placeholder_without_value_is_invalid(harness: Any, fresh_doubles: Any) -> None:
    al = person(fresh_doubles.issuer, "al").model_copy(update={"email": None})
    reply = await harness.resolve(claim("http_in_list", _args(fresh_doubles, "/{email}"), caller=al))
    assert (reply.outcome, reply.error_code) == ("error", "row_filter_invalid")
    assert fresh_doubles.endpoint.calls() == []


@pytest.mark.parametrize("answer", [(404, {"detail": "no"}), (200, "not json"), (200, {"other": 1})])
async def test_unreadable_or_refused_answer_is_an_error(
    harness: Any, fresh_doubles: Any, answer: Any
) -> None:
    fresh_doubles.endpoint.reset(answer)
    args = _args(fresh_doubles, response_path="items") if answer[1] == {"other": 1} else _args(fresh_doubles)
    reply = await harness.resolve(claim("http_in_list", args, caller=person(fresh_doubles.issuer, "al")))
    assert (reply.outcome, reply.error_code) == ("error", "row_filter_unavailable")
    assert len(fresh_doubles.endpoint.calls()) == 1


async def test_retry_failing_twice_then_answering_resolves(harness: Any, fresh_doubles: Any) -> None:
    fresh_doubles.endpoint.reset((200, ["m-1"]))
    fresh_doubles.endpoint.then((503, {}), (500, {}))
    plan = await harness.plan(
        claim("http_in_list", _args(fresh_doubles), caller=person(fresh_doubles.issuer, "al"))
    )
    assert plan.values == ("m-1",)
    assert len(fresh_doubles.endpoint.calls()) == 3


async def test_retry_failing_every_attempt_is_unavailable(harness: Any, fresh_doubles: Any) -> None:
    fresh_doubles.endpoint.reset((503, {"detail": "down"}))
    reply = await harness.resolve(
        claim("http_in_list", _args(fresh_doubles), caller=person(fresh_doubles.issuer, "al"))
    )
    assert (reply.outcome, reply.error_code) == ("error", "row_filter_unavailable")
    assert len(fresh_doubles.endpoint.calls()) == 3


async def test_retry_attempts_are_configurable(make_harness: Any, fresh_doubles: Any) -> None:
    fresh_doubles.endpoint.reset((502, {}))
    async with make_harness(resolver_retry_attempts=5) as h:
        reply = await h.resolve(
            claim("http_in_list", _args(fresh_doubles), caller=person(fresh_doubles.issuer, "al"))
        )
    assert reply.error_code == "row_filter_unavailable"
    assert len(fresh_doubles.endpoint.calls()) == 5
