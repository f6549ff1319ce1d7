"""Bad input that costs the service, and errors that reveal nothing (issue 19), over HTTP on
`POST /query` (normal and legacy EDR), `POST /query/plan` and `POST /dps/public/query`: the body
and statement limits, text PostgreSQL cannot take, paging outside bigint, the one fixed
`query_failed` answer, the statement timeout, and validation off the event loop.

Each refusal is checked for its status and code and for what it did not do: no plan requested
from the filter-resolver, no ds decision asked, no disclosure published."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from dataplane_local.doubles.ds_connector import DsConnectorDouble
from dataplane_testing.gateway import (
    AGREEMENT,
    FakeResolver,
    World,
    ds_policy,
    grant,
    pull_token,
    running_gateway,
)
from dataplane_testing.metrics import scrape
from dataplane_testing.metrics import series as metric
from dataplane_testing.topics import TopicTail
from query_gateway.sql import DEFAULT_LIMIT, MAX_LIMIT

TRANSFER = f"tp-{uuid.uuid4().hex[:12]}"  # names this module's disclosures among the session's
JSON = {"content-type": "application/json"}
PUBLIC_SQL = "SELECT id FROM stats ORDER BY id"


def refused(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json", response.text
    body: dict[str, Any] = response.json()
    assert body["error"] == code and "items" not in body, body
    detail: str = body["detail"]
    return detail


def body_of(sql: str, pad: str | None = None, **fields: Any) -> bytes:
    """JSON as a client may send it: `json.dumps` escapes a lone surrogate as `\\ud800`. `pad`
    sizes the body as a field of that text would, with JSON whitespace (an unknown field is
    refused, QE-01)."""
    if pad is not None:
        sized = len(json.dumps({"sql": sql, **fields, "pad": pad}).encode())
        plain = json.dumps({"sql": sql, **fields}).encode()
        return plain[:-1] + b" " * (sized - len(plain)) + b"}"
    return json.dumps({"sql": sql, **fields}).encode()


def edr_headers(world: World) -> dict[str, str]:
    return {
        **JSON,
        "Authorization": f"Bearer {world.edr()}",
        "Edc-Contract-Agreement-Id": AGREEMENT,
        "Edc-Transfer-Process-Id": TRANSFER,
    }


async def pull_headers(flows_url: str) -> dict[str, str]:
    return {
        **JSON,
        "Authorization": f"Bearer {pull_token(await grant(flows_url))}",
        "Edc-Transfer-Process-Id": TRANSFER,
    }


async def none_disclosed(disclosures: TopicTail) -> bool:
    return not [r for r in await disclosures.quiet() if TRANSFER in r.value.decode()]


@pytest.fixture
def stats_offered(ds: DsConnectorDouble) -> DsConnectorDouble:
    """ds allows `stats`: a request that reaches ds would be served, so a refusal is the gateway's."""
    ds.set_policy(ds_policy(["stats"]))
    return ds


async def on_every_route(
    client: httpx.AsyncClient,
    pull_client: httpx.AsyncClient,
    world: World,
    flows_url: str,
    content: bytes,
    status: int,
    code: str,
) -> list[str]:
    """The same body on the normal path, the plan, the EDR path and the DPS pull: one answer."""
    details = [
        refused(await client.post("/query", content=content, headers=JSON), status, code),
        refused(await client.post("/query/plan", content=content, headers=JSON), status, code),
        refused(await client.post("/query", content=content, headers=edr_headers(world)), status, code),
        refused(
            await pull_client.post(
                "/dps/public/query", content=content, headers=await pull_headers(flows_url)
            ),
            status,
            code,
        ),
    ]
    assert len(set(details)) == 1, details
    return details


# ---------------------------------------------------------------------------- body limit
async def test_body_over_limit_is_413_body_too_large(
    client: httpx.AsyncClient,
    pull_client: httpx.AsyncClient,
    world: World,
    flows_url: str,
    stats_offered: DsConnectorDouble,
    disclosures: TopicTail,
    caplog: pytest.LogCaptureFixture,
) -> None:
    limit = world.settings().query_max_body_bytes
    padding = limit - len(body_of(PUBLIC_SQL, pad=""))
    at_limit, over = body_of(PUBLIC_SQL, pad="x" * padding), body_of(PUBLIC_SQL, pad="x" * (padding + 1))
    assert (len(at_limit), len(over)) == (limit, limit + 1)
    # the largest admitted body is served
    r = await client.post("/query", content=at_limit, headers=JSON)
    assert r.status_code == 200 and r.json()["items"] == [{"id": 1}, {"id": 2}], r.text

    before = metric(
        await scrape(client),
        "query_gateway_requests_total",
        route="/query",
        status="413",
        code="body_too_large",
    )
    caplog.set_level(logging.INFO, logger="dataplane.audit")
    caplog.clear()
    details = await on_every_route(client, pull_client, world, flows_url, over, 413, "body_too_large")
    assert details[0] == f"request body larger than {limit} bytes"
    after = metric(
        await scrape(client),
        "query_gateway_requests_total",
        route="/query",
        status="413",
        code="body_too_large",
    )
    assert after == before + 2  # the normal and the EDR request
    audit = [r.msg for r in caplog.records if r.name == "dataplane.audit" and isinstance(r.msg, dict)]
    assert sorted(rec["route"] for rec in audit) == ["/dps/public/query", "/query", "/query", "/query/plan"]
    assert {(rec["outcome"], rec["reason"], rec["resource"]) for rec in audit} == {
        ("error", "body_too_large", None)
    }
    assert stats_offered.calls("authorize") == []
    assert await none_disclosed(disclosures)
    # the control: the same request under the limit is decided by ds and disclosed
    served = await client.post("/query", content=at_limit, headers=edr_headers(world))
    assert served.status_code == 200, served.text
    assert len(stats_offered.calls("authorize")) == 1
    assert await disclosures.read_where(1, lambda record: TRANSFER in record.value.decode())


async def test_a_chunked_body_is_counted_and_never_read_past_the_limit(
    client: httpx.AsyncClient, world: World
) -> None:
    limit, chunk = world.settings().query_max_body_bytes, 8192
    pulled = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal pulled
        while True:  # a body without end: only a bounded reader ever answers
            pulled += 1
            yield b" " * chunk

    refused(await client.post("/query", content=endless(), headers=JSON), 413, "body_too_large")
    assert pulled <= limit // chunk + 2
    # a declared length above the limit is refused before one byte is read
    pulled = 0
    declared = {**JSON, "content-length": str(limit + 1)}
    refused(await client.post("/query", content=endless(), headers=declared), 413, "body_too_large")
    assert pulled == 0


# ---------------------------------------------------------------------------- statement limit
async def test_sql_over_limit_is_400_sql_too_long_before_any_parse(
    client: httpx.AsyncClient, world: World
) -> None:
    limit = world.settings().query_max_sql_chars
    head, tail = "SELECT id FROM stats WHERE label <> '", "' ORDER BY id"
    longest = head + "x" * (limit - len(head) - len(tail)) + tail
    assert len(longest) == limit
    r = await client.post("/query", json={"sql": longest})
    assert r.status_code == 200 and r.json()["items"] == [{"id": 1}, {"id": 2}], r.text
    # one character more, and not even SQL: refused for its length, not for its syntax
    detail = refused(await client.post("/query", json={"sql": "(" * (limit + 1)}), 400, "sql_too_long")
    assert detail == f"sql query longer than {limit} characters"
    refused(await client.post("/query/plan", json={"sql": longest + " "}), 400, "sql_too_long")


# ---------------------------------------------------------------------------- text
BAD_TEXT = {
    "a lone surrogate in a literal": "SELECT id FROM stats WHERE label = '\ud800'",
    "a lone surrogate in a name": 'SELECT id FROM "st\udfffats"',
    "a NUL in a literal": "SELECT id FROM stats WHERE label = 'a\x00b'",
}


@pytest.mark.parametrize("case", BAD_TEXT)
async def test_lone_surrogate_or_nul_is_400_invalid_text_on_every_route(
    case: str,
    client: httpx.AsyncClient,
    pull_client: httpx.AsyncClient,
    world: World,
    flows_url: str,
    stats_offered: DsConnectorDouble,
    disclosures: TopicTail,
) -> None:
    details = await on_every_route(
        client, pull_client, world, flows_url, body_of(BAD_TEXT[case]), 400, "invalid_text"
    )
    assert "stats" not in details[0] and "label" not in details[0]  # the text is never quoted
    assert stats_offered.calls("authorize") == []  # ds was never asked
    assert await none_disclosed(disclosures)


async def test_lone_surrogate_is_400_and_requests_no_plan(
    client: httpx.AsyncClient, world: World, flushed: FakeResolver
) -> None:
    auth = {**JSON, "Authorization": f"Bearer {world.user_token('user-2')}"}
    sql = "SELECT id FROM registry WHERE pod <> '{}' ORDER BY id"
    refused(
        await client.post("/query", content=body_of(sql.format("\udc80")), headers=auth), 400, "invalid_text"
    )
    assert flushed.requests == []
    # the control: the same statement in plain text asks the resolver and is served
    r = await client.post("/query", content=body_of(sql.format("x")), headers=auth)
    assert [row["id"] for row in r.json()["items"]] == [1, 3], r.text
    assert len(flushed.requests) == 1


async def test_nul_byte_is_400_not_503(client: httpx.AsyncClient) -> None:
    for _ in range(3):  # refused each time, and the pool's connections stay healthy
        detail = refused(
            await client.post(
                "/query", content=body_of("SELECT id FROM stats WHERE label = '\x00'"), headers=JSON
            ),
            400,
            "invalid_text",
        )
        assert "NUL" in detail
    r = await client.post("/query", json={"sql": PUBLIC_SQL})
    assert r.status_code == 200 and r.json()["items"] == [{"id": 1}, {"id": 2}], r.text


@pytest.mark.parametrize(
    ("content", "what"),
    [
        (b'{"sql": "SELECT id FROM stats WHERE label = \'\xff\xfe\'"}', "not UTF-8 text"),
        (b'{"sql": "x"}\xc3', "not UTF-8 text"),
        (b"not json", "not a JSON document: expecting value at character 0"),
    ],
)
async def test_invalid_utf8_or_not_json_is_400_invalid_body(
    content: bytes,
    what: str,
    client: httpx.AsyncClient,
    pull_client: httpx.AsyncClient,
    world: World,
    flows_url: str,
    stats_offered: DsConnectorDouble,
) -> None:
    # not a JSON document at all: 400 with its own code (a body the model refuses stays 422)
    details = await on_every_route(client, pull_client, world, flows_url, content, 400, "invalid_body")
    assert details[0].startswith("invalid request: the body is "), details[0]
    assert what in details[0], details[0]  # what is wrong, never the text itself
    assert stats_offered.calls("authorize") == []


# ---------------------------------------------------------------------------- paging
async def test_offset_2_pow_63_is_422_invalid_request(
    client: httpx.AsyncClient,
    pull_client: httpx.AsyncClient,
    world: World,
    flows_url: str,
    stats_offered: DsConnectorDouble,
) -> None:
    for field, value in (
        ("offset", 2**63),
        ("offset", -(2**63) - 1),
        ("limit", 2**63),
        ("limit", -(2**63) - 1),
    ):
        details = await on_every_route(
            client,
            pull_client,
            world,
            flows_url,
            body_of(PUBLIC_SQL, **{field: value}),
            422,
            "invalid_request",
        )
        assert details[0].startswith(f"invalid request: {field} (input should be ")
        assert str(value) not in details[0]  # the bound is named, never the value sent
    assert stats_offered.calls("authorize") == []


async def test_paging_inside_bigint_keeps_the_documented_clamping(client: httpx.AsyncClient) -> None:
    r = await client.post("/query", json={"sql": PUBLIC_SQL, "offset": 2**63 - 1, "limit": 2**63 - 1})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["items"], body["offset"], body["limit"], body["total"]) == ([], 2**63 - 1, MAX_LIMIT, 2)
    r = await client.post("/query", json={"sql": PUBLIC_SQL, "offset": -(2**63), "limit": -(2**63)})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["items"], body["offset"], body["limit"]) == ([{"id": 1}, {"id": 2}], 0, DEFAULT_LIMIT)


# ---------------------------------------------------------------------------- failures
FAILING = {
    "division by zero": "SELECT id / (id - id) AS boom FROM stats",
    "a cast quoting the value": "SELECT CAST(label AS integer) AS n FROM stats",
}


@pytest.mark.parametrize("case", FAILING)
async def test_query_failure_names_no_class_or_sqlstate(
    case: str,
    client: httpx.AsyncClient,
    world: World,
    stats_offered: DsConnectorDouble,
    disclosures: TopicTail,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="query_gateway.sql.execute")
    sql = FAILING[case]
    normal = refused(await client.post("/query", json={"sql": sql}), 400, "query_failed")
    edr = refused(
        await client.post("/query", content=body_of(sql), headers=edr_headers(world)), 400, "query_failed"
    )
    assert normal == edr == "Database query failed"
    # the log line keeps the SQLSTATE (no personal data), never the driver's message
    lines = [
        r.msg for r in caplog.records if isinstance(r.msg, dict) and r.msg.get("event") == "query_failed"
    ]
    assert len(lines) == 2 and {line["sqlstate"] for line in lines} == {
        "22012" if "zero" in case else "22P02"
    }
    assert all(
        set(line) <= {"event", "error", "sqlstate", "level", "timestamp", "trace_id"} for line in lines
    )
    assert await none_disclosed(disclosures)  # nothing left for a failed query


async def test_statement_timeout_is_query_timeout(world: World) -> None:
    # every pair of `stats` rows, 26 times over: 2^26 rows to count, far beyond 50 ms
    tables = ", ".join(f"stats s{i}" for i in range(26))
    # the calibrated cost guard (QE-06) would refuse it before it runs: the timeout is under test
    settings = world.settings(query_statement_timeout_ms=50, query_plan_cost_calibrate=False)
    async with running_gateway(settings) as gateway:
        r = await gateway.post("/query", json={"sql": f"SELECT count(*) AS n FROM {tables}"})
        assert refused(r, 400, "query_timeout") == "Query exceeded time limit"
        served = await gateway.post("/query", json={"sql": PUBLIC_SQL})  # the pool is unharmed
        assert served.status_code == 200, served.text


# ---------------------------------------------------------------------------- the event loop
def costly_statement(length: int) -> str:
    """`length` characters of the costliest shape measured (a list of one-digit items), refused
    only once parsed and walked: it names a dataset nobody has, unique so no cache knows it."""
    head = f"SELECT id FROM nowhere_{uuid.uuid4().hex} WHERE id IN (1"
    return head + ",1" * ((length - len(head) - 1) // 2) + ")"


async def test_healthz_answers_while_a_big_statement_is_validated(
    client: httpx.AsyncClient, world: World
) -> None:
    limit = world.settings().query_max_sql_chars
    statements = [costly_statement(limit) for _ in range(6)]
    assert all(limit - 2 <= len(s) <= limit for s in statements)
    bigs = [asyncio.create_task(client.post("/query", json={"sql": s})) for s in statements]
    for _ in range(20):  # every request runs up to its first wait: the parse, if that is on the loop
        await asyncio.sleep(0)
    health = await client.get("/healthz")
    in_flight = [not big.done() for big in bigs]
    answers = await asyncio.gather(*bigs)
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    # /healthz was answered while statements were still being validated, not after them
    assert any(in_flight), in_flight
    for answer in answers:
        assert "nowhere_" in refused(answer, 400, "unknown_dataset")
