"""The http-pull profile (issue 13): accepted and registered when listed, a start answers the
profile's data address, and its access token is an expiring ES256 JWT naming the flow."""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from dataplane_testing.signaling import FLOWS, auth, new_id, run_app, sql, start_message

PROFILE = "https://w3id.org/dspace-sig/profile/http-pull"
PROVIDER, CONSUMER = "did:web:provider.example", "did:web:consumer.example"


def props_of(body: dict[str, Any]) -> dict[str, Any]:
    return {p["name"]: p["value"] for p in body["dataAddress"]["endpointProperties"]}


@pytest.fixture
async def profiled(base_settings: dict[str, Any]) -> AsyncIterator[Any]:
    """Signaling serving the legacy type and the profile (listed by its short name)."""
    values = {
        **base_settings,
        "dps_transfer_types": ["HttpData-PULL", "http-pull"],
        "dps_token_ttl_seconds": 120,
    }
    async with run_app(values) as running:
        yield running


async def _start(
    app: Any, token: str, transfer_type: str = PROFILE, **over: Any
) -> tuple[str, dict[str, Any]]:
    flow = new_id()
    r = await app.client.post(
        f"{FLOWS}/start", json=start_message(flow, transferType=transfer_type, **over), headers=auth(token)
    )
    assert r.status_code == 200, r.text
    return flow, r.json()


@pytest.mark.parametrize("spelling", [PROFILE, "http-pull"])
async def test_http_pull_start_answers_the_profile_address(
    profiled: Any, cp_token: Any, spelling: str
) -> None:
    flow, body = await _start(profiled, cp_token(), spelling)
    assert body["state"] == "STARTED" and body["dataFlowId"] == flow
    address = body["dataAddress"]
    assert address["endpointType"] == PROFILE
    assert address["endpoint"] == "https://gateway.example/dps/public"
    props = props_of(body)
    # the endpoint is the address's own, not repeated among the properties
    assert set(props) == {
        "authType",
        "authorization",
        "refreshToken",
        "expiresIn",
        "refreshEndpoint",
    }
    assert props["authType"] == "bearer"
    assert props["expiresIn"] == "120" and props["expiresIn"].isdigit()
    assert props["refreshEndpoint"] == "https://signaling.example/dps/token"
    assert props["refreshToken"] and props["refreshToken"] != props["authorization"]
    # recorded under the profile URI whichever spelling the control plane used
    [row] = await sql(_db(profiled), "SELECT transfer_type FROM dps_data_flows WHERE id = $1", flow)
    assert row["transfer_type"] == PROFILE


async def test_http_pull_access_token_carries_the_flow_claims(
    profiled: Any, cp_token: Any, signing_key: ec.EllipticCurvePrivateKey
) -> None:
    before = int(time.time())
    flow, body = await _start(profiled, cp_token())
    token = props_of(body)["authorization"]
    assert jwt.get_unverified_header(token)["alg"] == "ES256"
    claims = jwt.decode(token, signing_key.public_key(), algorithms=["ES256"], audience=PROVIDER)
    assert set(claims) == {"iss", "sub", "aud", "iat", "exp", "dataFlowId", "jti", "datasetId", "agreementId"}
    assert claims["iss"] == PROVIDER and claims["aud"] == PROVIDER and claims["sub"] == CONSUMER
    assert claims["dataFlowId"] == flow
    assert claims["datasetId"] == "dataset-1" and claims["agreementId"] == "agreement-1"
    assert before <= claims["iat"] and claims["exp"] - claims["iat"] == 120


async def test_http_pull_the_ttl_defaults_to_300_seconds(
    base_settings: dict[str, Any], cp_token: Any
) -> None:
    async with run_app({**base_settings, "dps_transfer_types": [PROFILE]}) as app:
        _, body = await _start(app, cp_token())
        claims = jwt.decode(props_of(body)["authorization"], options={"verify_signature": False})
        assert claims["exp"] - claims["iat"] == 300
        assert props_of(body)["expiresIn"] == "300"


async def test_http_pull_is_refused_unless_listed(signaling: Any, cp_token: Any) -> None:
    for spelling in (PROFILE, "http-pull"):
        r = await signaling.client.post(
            f"{FLOWS}/start", json=start_message(new_id(), transferType=spelling), headers=auth(cp_token())
        )
        assert r.status_code == 400 and r.json()["error"] == "unsupported_transfer_type"


async def test_http_pull_is_registered_under_its_uri(profiled: Any, cp_token: Any) -> None:
    r = await profiled.client.get("/dps/registration", headers=auth(cp_token()))
    assert r.json()["transferTypes"] == ["HttpData-PULL", PROFILE]


async def test_http_pull_the_rc3_profile_field_is_read(profiled: Any, cp_token: Any) -> None:
    msg = start_message(new_id(), transferType=..., profile=PROFILE)
    r = await profiled.client.post(f"{FLOWS}/start", json=msg, headers=auth(cp_token()))
    assert r.status_code == 200 and r.json()["dataAddress"]["endpointType"] == PROFILE


async def test_http_pull_only_ids_and_hashes_are_stored(profiled: Any, cp_token: Any) -> None:
    flow, body = await _start(profiled, cp_token())
    props = props_of(body)
    jti = jwt.decode(props["authorization"], options={"verify_signature": False})["jti"]
    [row] = await sql(_db(profiled), "SELECT * FROM dps_data_flows WHERE id = $1", flow)
    assert row["token_id"] == jti
    assert row["refresh_hash"] == hashlib.sha256(props["refreshToken"].encode()).hexdigest()
    stored = " ".join(str(v) for v in row.values())
    assert props["authorization"] not in stored and props["refreshToken"] not in stored


@pytest.mark.parametrize("signal", ["suspend", "terminate", "completed"])
async def test_http_pull_retiring_signals_retire_both_tokens(
    profiled: Any, cp_token: Any, signal: str
) -> None:
    flow, _ = await _start(profiled, cp_token())
    r = await profiled.client.post(f"{FLOWS}/{flow}/{signal}", json={}, headers=auth(cp_token()))
    assert r.status_code == 200, r.text
    [row] = await sql(_db(profiled), "SELECT token_id, refresh_hash FROM dps_data_flows WHERE id = $1", flow)
    assert row["token_id"] is None and row["refresh_hash"] is None


async def test_http_pull_resume_issues_a_new_pair(profiled: Any, cp_token: Any) -> None:
    flow, first = await _start(profiled, cp_token())
    await profiled.client.post(f"{FLOWS}/{flow}/suspend", json={}, headers=auth(cp_token()))
    r = await profiled.client.post(f"{FLOWS}/{flow}/resume", json={}, headers=auth(cp_token()))
    assert r.status_code == 200, r.text
    old, new = props_of(first), props_of(r.json())
    assert r.json()["dataAddress"]["endpointType"] == PROFILE
    assert new["authorization"] != old["authorization"] and new["refreshToken"] != old["refreshToken"]
    [row] = await sql(_db(profiled), "SELECT token_id, refresh_hash FROM dps_data_flows WHERE id = $1", flow)
    assert row["refresh_hash"] == hashlib.sha256(new["refreshToken"].encode()).hexdigest()
    assert row["token_id"] == jwt.decode(new["authorization"], options={"verify_signature": False})["jti"]


def _db(app: Any) -> str:
    return str(app.settings.database_url.replace("+asyncpg", ""))
