"""The normal API path: authentication, access levels and policy (docs/gateway.md), the two
catalogue layers (GS-06, GS-07, GS-10), the pure handlers (RF-04, RF-05) and the response."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from dataplane_testing.gateway import CATALOGUE, FakeResolver, World, refused, running_gateway

VIEWER_A = {"organization": {"org-a": {"type": ["rec"], "groups": ["/viewers"]}}}
ADMIN_ROLE = {"realm_access": {"roles": ["platform-admin"]}}


async def post(client: httpx.AsyncClient, sql: str, token: str | None = None, **body: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return await client.post("/query", json={"sql": sql, **body}, headers=headers)


def ids(response: httpx.Response) -> list[int]:
    assert response.status_code == 200, response.text
    return [row["id"] for row in response.json()["items"]]


async def test_public_dataset_is_served_anonymously_with_the_page_shape(client: httpx.AsyncClient) -> None:
    r = await post(client, "SELECT id, label FROM stats ORDER BY id")
    assert r.status_code == 200
    assert r.json() == {
        "items": [{"id": 1, "label": "a"}, {"id": 2, "label": "b"}],
        "offset": 0,
        "limit": 100,
        "count": 2,
        "total": 2,
    }


async def test_skip_count_and_paging(client: httpx.AsyncClient) -> None:
    r = await post(client, "SELECT id FROM stats ORDER BY id", limit=1, offset=1, skip_count=True)
    assert r.json() == {"items": [{"id": 2}], "offset": 1, "limit": 1, "count": 1, "total": None}


async def test_missing_sql_is_refused(client: httpx.AsyncClient) -> None:
    refused(await client.post("/query", json={}), 400, "sql_refused")


async def test_auth_required_unless_both_layers_allow_all(client: httpx.AsyncClient) -> None:
    refused(await post(client, "SELECT id FROM notes"), 401, "auth_required")


async def test_an_internal_dataset_requires_authentication(client: httpx.AsyncClient) -> None:
    refused(await post(client, "SELECT id FROM unscoped"), 401, "auth_required")


async def test_an_invalid_bearer_is_401_invalid_token_even_on_a_public_dataset(
    client: httpx.AsyncClient, world: World
) -> None:
    refused(await post(client, "SELECT id FROM stats", "not-a-jwt"), 401, "invalid_token")
    from cryptography.hazmat.primitives.asymmetric import ec

    forged = world.issuer.mint(
        {"sub": "user-1"}, audience="svc-query-gateway", sign_with=ec.generate_private_key(ec.SECP256R1())
    )
    refused(await post(client, "SELECT id FROM stats", forged), 401, "invalid_token")
    wrong_aud = world.issuer.mint({"sub": "user-1"}, audience="another-service")
    refused(await post(client, "SELECT id FROM stats", wrong_aud), 401, "invalid_token")
    expired = world.issuer.mint({"sub": "user-1"}, audience="svc-query-gateway", expires_in=-60)
    refused(await post(client, "SELECT id FROM stats", expired), 401, "invalid_token")


async def test_jwks_is_refetched_on_an_unknown_kid(client: httpx.AsyncClient, world: World) -> None:
    assert ids(await post(client, "SELECT id FROM notes ORDER BY id", world.user_token())) == [1, 3]
    world.issuer.rotate(keep_old=True)
    assert ids(await post(client, "SELECT id FROM notes ORDER BY id", world.user_token())) == [1, 3]


async def test_direct_user_match_serves_the_callers_own_rows(client: httpx.AsyncClient, world: World) -> None:
    assert ids(await post(client, "SELECT id FROM notes ORDER BY id", world.user_token("user-2"))) == [2]


async def test_rf04_subject_key_match_without_keys_serves_no_rows_on_the_normal_path(
    client: httpx.AsyncClient, world: World
) -> None:
    # a service passes the policy, but its principals never stand in for keys
    r = await post(client, "SELECT count(*) AS n FROM readings", world.service_token())
    assert r.status_code == 200, r.text
    # a deny puts FALSE into every SELECT, the outer page too: nothing is read (RF-05)
    assert r.json()["items"] == []
    assert r.json()["total"] == 0


async def test_rf04_a_filter_without_key_type_is_500_row_filter_invalid(
    client: httpx.AsyncClient, world: World
) -> None:
    refused(await post(client, "SELECT id FROM no_key_type", world.user_token()), 500, "row_filter_invalid")


async def test_not_exposed_or_secret_is_403_not_available(client: httpx.AsyncClient) -> None:
    refused(await post(client, "SELECT id FROM hidden"), 403, "not_available")
    refused(await post(client, "SELECT id FROM secret_ds"), 403, "not_available")


async def test_gs10_deny_all_or_undeclared_layer_is_403_row_policy_denied(
    client: httpx.AsyncClient, world: World
) -> None:
    token = world.user_token()
    refused(await post(client, "SELECT id FROM closed", token), 403, "row_policy_denied")
    refused(await post(client, "SELECT id FROM half_declared", token), 403, "row_policy_denied")


async def test_gs06_organization_match_narrows_to_reading_organizations(
    client: httpx.AsyncClient, world: World
) -> None:
    token = world.user_token(
        organization={"org-a": {"groups": ["/viewers"]}, "org-b": {"groups": ["/managers"]}}
    )
    assert ids(await post(client, "SELECT id FROM assets ORDER BY id", token)) == [1, 2]


async def test_gs06_an_editor_is_not_an_organization_reader(client: httpx.AsyncClient, world: World) -> None:
    token = world.user_token(organization={"org-a": {"groups": ["/editors"]}})
    refused(await post(client, "SELECT id FROM assets", token), 403, "policy")


async def test_gs06_a_service_account_is_not_narrowed(client: httpx.AsyncClient, world: World) -> None:
    assert ids(await post(client, "SELECT id FROM assets ORDER BY id", world.service_token())) == [1, 2, 3]


async def test_policy_a_service_without_the_query_scope_is_403(
    client: httpx.AsyncClient, world: World
) -> None:
    refused(await post(client, "SELECT id FROM assets", world.service_token(scope="other")), 403, "policy")


async def test_gs07_member_wide_serves_every_row_to_a_reader(client: httpx.AsyncClient, world: World) -> None:
    assert ids(await post(client, "SELECT id FROM members ORDER BY id", world.user_token(**VIEWER_A))) == [
        1,
        2,
    ]


async def test_gs07_an_internal_dataset_that_is_not_row_scoped_is_closed_to_readers(
    client: httpx.AsyncClient, world: World
) -> None:
    r = await post(client, "SELECT id FROM unscoped", world.user_token(**VIEWER_A))
    refused(r, 403, "policy")
    assert r.json()["detail"] == "internal dataset without a row filter - platform-admin or services only"


async def test_restricted_needs_admin_scope_or_platform_admin(
    client: httpx.AsyncClient, world: World
) -> None:
    refused(await post(client, "SELECT id FROM restricted_ds", world.service_token()), 403, "policy")
    assert ids(
        await post(client, "SELECT id FROM restricted_ds ORDER BY id", world.service_token("dataset.admin"))
    ) == [1, 2]


async def test_platform_admin_skips_row_filters(client: httpx.AsyncClient, world: World) -> None:
    token = world.user_token(**ADMIN_ROLE)
    assert ids(await post(client, "SELECT id FROM readings ORDER BY id", token)) == [1, 2, 3]
    assert ids(await post(client, "SELECT id FROM closed ORDER BY id", token)) == [1, 2]


async def test_a_platform_admin_group_inside_an_organization_is_no_grant(
    client: httpx.AsyncClient, world: World
) -> None:
    token = world.user_token(organization={"org-a": {"groups": ["/platform-admin"]}})
    refused(await post(client, "SELECT id FROM readings", token), 403, "policy")


async def test_query_plan_labels_parameters_and_never_shows_values(
    client: httpx.AsyncClient, world: World
) -> None:
    token = world.user_token(
        organization={"org-a": {"groups": ["/viewers"]}, "org-b": {"groups": ["/viewers"]}}
    )
    r = await client.post(
        "/query/plan", json={"sql": "SELECT id FROM assets"}, headers={"Authorization": f"Bearer {token}"}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert [p["label"] for p in body["params"]] == ["organization aliases (2 values)"]
    assert "org-a" not in r.text and "org-b" not in r.text
    assert "$1" in body["sql"]


async def test_query_plan_has_the_same_authentication(client: httpx.AsyncClient) -> None:
    refused(await client.post("/query/plan", json={"sql": "SELECT id FROM notes"}), 401, "auth_required")


async def test_query_plan_refuses_by_policy_exactly_as_query_does(
    client: httpx.AsyncClient, world: World
) -> None:
    token = world.user_token(**VIEWER_A)
    headers = {"Authorization": f"Bearer {token}"}
    for sql in ("SELECT id FROM unscoped", "SELECT id FROM restricted_ds"):
        query = await client.post("/query", json={"sql": sql}, headers=headers)
        plan = await client.post("/query/plan", json={"sql": sql}, headers=headers)
        refused(plan, 403, "policy")
        assert plan.json() == query.json()


async def test_query_plan_executes_nothing(client: httpx.AsyncClient) -> None:
    # executed, this statement fails in the database on its first row (division by zero)
    sql = "SELECT id / (id - id) AS boom FROM stats"
    refused(await client.post("/query", json={"sql": sql}), 400, "query_failed")
    r = await client.post("/query/plan", json={"sql": sql})
    assert r.status_code == 200, r.text
    assert "items" not in r.json() and "boom" in r.json()["sql"]


async def test_query_plan_labels_a_lookup_plans_values_by_count_never_by_value(
    client: httpx.AsyncClient, world: World, flushed: FakeResolver
) -> None:
    token = world.user_token("user-2")  # the resolver double finds pod-1 and pod-3
    r = await client.post(
        "/query/plan", json={"sql": "SELECT id FROM registry"}, headers={"Authorization": f"Bearer {token}"}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["params"] == [{"param": "$1", "label": "pod keys (2 values)"}]
    assert "$1" in body["sql"] and body["denied"] is False
    for value in ("pod-1", "pod-3"):
        assert value not in r.text
    # the same caller's /query reads exactly those rows: the labels describe the real plan
    rows = await post(client, "SELECT id FROM registry ORDER BY id", token)
    assert ids(rows) == [1, 3]


PROBE_SQL = """
CREATE OR REPLACE FUNCTION plan_probe_read() RETURNS boolean LANGUAGE sql VOLATILE AS $$
  SELECT pg_notify('plan_probe', 'read'); SELECT true
$$;
CREATE OR REPLACE VIEW plan_probe AS SELECT id FROM stats WHERE plan_probe_read();
"""
PROBE_DATASET = """
  - id: probe               # every read of it sends NOTIFY plan_probe when its transaction commits
    table: plan_probe
    access_level: open
    expose: true
    row_filters:
      person: {handler: allow_all, binds: person}
      organization: {handler: allow_all, binds: organization}
"""


async def test_query_plan_sends_no_statement_to_the_database(world: World, tmp_path: Path) -> None:
    """Observed in the database itself: the probe view notifies on every committed read. A
    sentinel NOTIFY sent last arrives after everything committed before it, so counting the
    reads before it needs no waiting on time."""
    listener = await asyncpg.connect(world.datasets_url)
    heard: asyncio.Queue[str] = asyncio.Queue()
    try:
        await listener.execute(PROBE_SQL)
        await listener.add_listener("plan_probe", lambda *args: heard.put_nowait(args[3]))
        catalogue = tmp_path / "catalogue.yaml"
        catalogue.write_text(CATALOGUE.read_text().rstrip("\n") + "\n" + PROBE_DATASET)
        async with running_gateway(world.settings(catalogue_path=str(catalogue))) as gateway:
            plan = await gateway.post("/query/plan", json={"sql": "SELECT id FROM probe"})
            assert plan.status_code == 200, plan.text
            query = await gateway.post("/query", json={"sql": "SELECT id FROM probe ORDER BY id"})
            assert ids(query) == [1, 2]  # the control: a real read is heard
        await listener.execute("SELECT pg_notify('plan_probe', 'sentinel')")
        payloads = []
        async with asyncio.timeout(20):  # against a hang only
            while not payloads or payloads[-1] != "sentinel":
                payloads.append(await heard.get())
    finally:
        await listener.close()
    # one read: the /query's (its page and count share one transaction); none from /query/plan
    assert payloads == ["read", "sentinel"]
