"""Issue 14: signaling serves its OpenAPI document (`/openapi.json`, `/docs`), and schemathesis,
driving the real service over HTTP (PostgreSQL, broker, OIDC issuer double) from that document,
finds no 5xx and no answer outside what the document says."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dataplane_local.doubles.server import RunningServer, serve_in_thread
from dataplane_testing import openapi as conformance
from dataplane_testing import signaling as support
from signaling.app import create_app
from signaling.settings import Settings


@pytest.fixture
def served(base_settings: dict[str, Any]) -> Iterator[RunningServer]:
    server = serve_in_thread(create_app(Settings(**base_settings)))
    yield server
    server.stop()


def test_openapi_documents_every_route_and_docs_are_served(served: RunningServer) -> None:
    import httpx

    document = httpx.get(f"{served.url}/openapi.json").json()
    routes = {(m.upper(), p) for p, ops in document["paths"].items() for m in ops}
    assert routes == {
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("GET", "/metrics"),
        ("GET", "/dps/registration"),
        ("POST", "/dps/token"),
        ("PUT", "/dps/v1/controlplanes"),
        ("DELETE", "/dps/v1/controlplanes/{controlplane_id}"),
        ("POST", "/dps/v1/dataflows/prepare"),
        ("POST", "/dps/v1/dataflows/start"),
        ("POST", "/dps/v1/dataflows/{flow_id}/started"),
        ("POST", "/dps/v1/dataflows/{flow_id}/suspend"),
        ("POST", "/dps/v1/dataflows/{flow_id}/resume"),
        ("POST", "/dps/v1/dataflows/{flow_id}/terminate"),
        ("POST", "/dps/v1/dataflows/{flow_id}/completed"),
        ("GET", "/dps/v1/dataflows/{flow_id}/status"),
    }
    start = document["paths"]["/dps/v1/dataflows/start"]["post"]
    assert start["security"] == [{"controlPlane": []}]
    codes = start["responses"]["400"]["content"]["application/problem+json"]["schema"]["properties"]["error"]
    assert set(codes["enum"]) == {
        "unsupported_transfer_type",
        "data_address_not_allowed",
        "callback_address_required",
    }
    # DPS_ASYNC_SIGNALS: prepare and start may answer 202 with the flow's status as Location
    for signal in ("prepare", "start"):
        accepted = document["paths"][f"/dps/v1/dataflows/{signal}"]["post"]["responses"]["202"]
        assert "Location" in accepted["headers"]
    conformance.docs_served_from_the_package(served.url)
    assert document["servers"] == [{"url": "/", "description": "this service, where the document is served"}]


def test_schemathesis_finds_no_5xx_and_no_undocumented_answer(
    served: RunningServer, cp_token: Callable[..., str]
) -> None:
    schema = conformance.load(served.url)
    ops = conformance.operations(schema)
    auth = support.auth(cp_token())
    # the answers random requests rarely reach: a started pull flow, its status, its suspension
    flow = support.new_id()
    started = conformance.call_checked(
        ops["POST /dps/v1/dataflows/start"], body=support.start_message(flow), headers=auth
    )
    assert started.status_code == 200, started.text
    for key, params in (
        ("GET /dps/v1/dataflows/{flow_id}/status", {"flow_id": flow}),
        ("POST /dps/v1/dataflows/{flow_id}/suspend", {"flow_id": flow}),
        ("POST /dps/v1/dataflows/{flow_id}/resume", {"flow_id": flow}),
    ):
        answer = conformance.call_checked(ops[key], path_parameters=params, headers=auth)
        assert answer.status_code == 200, (key, answer.text)
    assert conformance.call_checked(ops["GET /dps/registration"], headers=auth).status_code == 200
    sent = sum(conformance.run_operation(op, headers=auth, examples=5) for op in ops.values())
    assert sent >= len(ops)
    # and without a bearer, every signal is refused before anything else (DPS-02)
    for key, op in ops.items():
        if key.split(" ", 1)[1].startswith("/dps"):
            assert conformance.run_operation(op, examples=1) > 0


async def test_dps01_without_dps_the_document_has_only_health_routes(base_settings: dict[str, Any]) -> None:
    import httpx

    app = create_app(Settings(**{**base_settings, "dps_enabled": False}))  # no lifespan needed
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://signaling") as client:
        document = (await client.get("/openapi.json")).json()
    assert set(document["paths"]) == {"/healthz", "/readyz", "/metrics"}
    assert "securitySchemes" not in document.get("components", {})
