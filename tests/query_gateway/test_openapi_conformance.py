"""Issue 14: the gateway serves its OpenAPI document (`/openapi.json`, `/docs`) describing the
query routes as both doors answer them, and schemathesis, driving the real gateway over HTTP
(PostgreSQL, Redis, broker, the OIDC issuer and ds doubles) from that document, finds no 5xx and
no answer outside what the document says."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from dataplane_local.doubles.ds_connector import DsConnectorDouble
from dataplane_local.doubles.server import RunningServer, serve_in_thread
from dataplane_testing import openapi as conformance
from dataplane_testing.gateway import AGREEMENT, PUBLIC_PEM, World, ds_policy, pull_token, started_grant
from query_gateway.app import create_app

ROUTES = {
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("POST", "/query"),
    ("POST", "/query/plan"),
    ("POST", "/dps/public/query"),
    ("GET", "/dps/public/streams/{dataset}"),
    ("GET", "/dps/public/streams/{dataset}/records"),
    ("GET", "/.well-known/oauth-protected-resource"),
}
DPS_ONLY = {(m, p) for m, p in ROUTES if p.startswith(("/dps/", "/.well-known/"))}


@pytest.fixture(scope="module")
def served(world: World, flows_url: str) -> Iterator[RunningServer]:
    """One gateway serving every route: EDR and DPS enabled, as an uvicorn server."""
    settings = world.settings(
        dps_enabled=True, dps_token_public_key=PUBLIC_PEM, dps_flows_database_url=flows_url
    )
    server = serve_in_thread(create_app(settings))
    yield server
    server.stop()


def test_openapi_documents_every_route_its_headers_and_codes(served: RunningServer) -> None:
    document = httpx.get(f"{served.url}/openapi.json").json()
    assert {(m.upper(), p) for p, ops in document["paths"].items() for m in ops} == ROUTES
    query = document["paths"]["/query"]["post"]
    headers = {p["name"].lower() for p in query["parameters"] if p["in"] == "header"}
    assert {"edc-contract-agreement-id", "edc-transfer-process-id", "edc-purpose"} <= headers
    assert {"x-request-id", "traceparent"} <= headers
    # issue 33: the bearer is each route's security, never a header parameter (which OpenAPI
    # ignores, so a viewer or a generated client would send no token)
    assert "authorization" not in headers
    schemes = document["components"]["securitySchemes"]
    assert {s["scheme"] for s in schemes.values()} == {"bearer"}
    assert query["security"] == [{"oidcBearer": []}, {"edrToken": []}, {}]
    assert document["paths"]["/query/plan"]["post"]["security"] == [{"oidcBearer": []}, {}]
    for path, ops in document["paths"].items():
        if path.startswith("/dps/public/") and "oauth" not in path:
            for op in ops.values():
                assert op["security"] == [{"pullToken": []}], path
    assert document["servers"] == [{"url": "/", "description": "this service, where the document is served"}]
    body = document["components"]["schemas"]["QueryBody"]["properties"]
    assert set(body) == {"sql", "limit", "offset", "skip_count"}
    assert body["limit"]["maximum"] == 2**63 - 1  # exact, not FastAPI's float
    pull = document["paths"]["/dps/public/query"]["post"]["responses"]
    assert (
        "pull_token"
        in pull["401"]["content"]["application/problem+json"]["schema"]["properties"]["error"]["enum"]
    )
    assert set(pull) == {"200", "400", "401", "403", "413", "422", "429", "500", "502", "503"}
    # GS-14: the 429 says when to come back; QE-06's refusal is documented with the other 400s
    assert pull["429"]["headers"]["Retry-After"]["required"] is True
    codes_503 = pull["503"]["content"]["application/problem+json"]["schema"]["properties"]["error"]["enum"]
    assert "rate_limit_unavailable" in codes_503
    codes_400 = query["responses"]["400"]["content"]["application/problem+json"]["schema"]["properties"]
    assert "query_too_expensive" in codes_400["error"]["enum"]
    # issue 32: the records route documents change sessions, their answer and their codes
    records = document["paths"]["/dps/public/streams/{dataset}/records"]["get"]
    assert {"changes_since", "wait"} <= {p["name"] for p in records["parameters"] if p["in"] == "query"}
    answers = records["responses"]["200"]["content"]["application/json"]["schema"]["anyOf"]
    assert {a["$ref"].rsplit("/", 1)[-1] for a in answers} == {"RecordsPage", "ChangesPage"}
    changes = document["components"]["schemas"]["ChangesPage"]
    assert set(changes["properties"]) == {"items", "limit", "has_more", "next_changes_since"}
    tombstone = document["components"]["schemas"]["Tombstone"]
    assert set(tombstone["properties"]) == {"key", "tombstone"} and tombstone["additionalProperties"] is False
    assert records["responses"]["409"]["content"]["application/problem+json"]["schema"]["properties"][
        "error"
    ]["enum"] == ["resync_required"]
    codes_400 = records["responses"]["400"]["content"]["application/problem+json"]["schema"]["properties"]
    assert {"invalid_cursor", "invalid_request"} <= set(codes_400["error"]["enum"])
    conformance.docs_served_from_the_package(served.url)


async def test_schemathesis_finds_no_5xx_and_no_undocumented_answer(
    served: RunningServer, world: World, ds: DsConnectorDouble, flows_url: str
) -> None:
    ds.set_policy(ds_policy([{"dataset_id": "stats", "row_filter": None}]))
    jti = await started_grant(flows_url)
    schema = conformance.load(served.url)
    ops = conformance.operations(schema)
    stats = {"sql": "SELECT id, label FROM stats ORDER BY id"}
    # the answers random requests rarely reach: a page on each path, a plan
    user = {"Authorization": f"Bearer {world.user_token()}", "X-Request-ID": "req-1"}
    edr = {
        "Authorization": f"Bearer {world.edr()}",
        "Edc-Contract-Agreement-Id": AGREEMENT,
        "Edc-Purpose": "analytics",
    }
    for key, headers, body in (
        ("POST /query", user, {**stats, "skip_count": True}),
        ("POST /query", edr, stats),
        ("POST /query/plan", user, stats),
        ("POST /dps/public/query", {"Authorization": f"Bearer {pull_token(jti)}"}, stats),
    ):
        answer = conformance.call_checked(ops[key], headers=headers, body=body)
        assert answer.status_code == 200, (key, answer.text)
    pull = {"Authorization": f"Bearer {pull_token(jti)}"}
    stream = conformance.call_checked(
        ops["GET /dps/public/streams/{dataset}"], headers=pull, path_parameters={"dataset": "stats"}
    )
    assert stream.status_code == 200, stream.text
    not_records = conformance.call_checked(
        ops["GET /dps/public/streams/{dataset}/records"], headers=pull, path_parameters={"dataset": "stats"}
    )
    assert not_records.status_code == 403, not_records.text  # stats declares no records
    assert conformance.call_checked(ops["GET /.well-known/oauth-protected-resource"]).status_code == 200
    sent = sum(conformance.run_operation(op) for op in ops.values())
    assert sent >= len(ops)


async def test_dps01_without_dps_the_document_has_no_pull_route(world: World) -> None:
    app = create_app(world.settings())  # the document needs no lifespan: nothing is connected
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        document = (await client.get("/openapi.json")).json()
    assert {(m.upper(), p) for p, ops in document["paths"].items() for m in ops} == ROUTES - DPS_ONLY
