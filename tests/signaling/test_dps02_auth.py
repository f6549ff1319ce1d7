"""DPS-02 — only admitted control planes may signal; refusals are audited (GS-02)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from dataplane_local.doubles.oidc import OidcIssuer
from dataplane_testing.signaling import (
    AUDIENCE,
    CP,
    FLOWS,
    OTHER_CP,
    STRANGER,
    auth,
    consumer_address,
    new_id,
    run_app,
    start_message,
)


async def _start(app: Any, headers: dict[str, str], flow: str | None = None) -> Any:
    return await app.client.post(f"{FLOWS}/start", json=start_message(flow or new_id()), headers=headers)


async def test_dps02_an_admitted_client_may_signal(signaling: Any, cp_token: Any) -> None:
    assert (await _start(signaling, auth(cp_token(CP)))).status_code == 200
    assert (await _start(signaling, auth(cp_token(OTHER_CP)))).status_code == 200


async def test_dps02_client_id_is_read_when_azp_is_absent(signaling: Any, oidc: OidcIssuer) -> None:
    token = oidc.mint({"client_id": CP}, audience=AUDIENCE)
    assert (await _start(signaling, auth(token))).status_code == 200


@pytest.mark.parametrize(
    "header",
    [None, "", "Bearer", "Bearer ", "Basic abc", "Token abc"],
)
async def test_dps02_no_bearer_is_401_no_token(signaling: Any, header: str | None) -> None:
    headers = {} if header is None else {"Authorization": header}
    r = await _start(signaling, headers)
    assert r.status_code == 401
    assert r.json()["error"] == "no_token"
    assert r.headers["www-authenticate"] == "Bearer"


async def test_dps02_an_invalid_token_is_401(signaling: Any, oidc: OidcIssuer) -> None:
    forged = oidc.mint({"azp": CP}, audience=AUDIENCE, sign_with=ec.generate_private_key(ec.SECP256R1()))
    invalid = [
        "junk",
        forged,
        oidc.mint({"azp": CP}, audience=AUDIENCE, expires_in=-60),
        oidc.mint({"azp": CP}, audience="someone-else"),
        oidc.mint({"azp": CP}, audience=AUDIENCE, issuer="https://evil.example"),
        oidc.mint({"azp": CP}, audience=AUDIENCE, kid="unknown-kid"),
    ]
    for token in invalid:
        r = await _start(signaling, auth(token))
        assert r.status_code == 401, token
        assert r.json() == {
            "type": "urn:dataplane:error:invalid_token",
            "title": "Invalid token",
            "status": 401,
            "error": "invalid_token",
            "detail": "signalling token is not valid",
        }
        assert r.headers["www-authenticate"] == 'Bearer error="invalid_token"'
        assert r.headers["content-type"] == "application/problem+json"


async def test_dps02_a_client_not_listed_is_403(signaling: Any, oidc: OidcIssuer, cp_token: Any) -> None:
    for token in (cp_token(STRANGER), oidc.mint({"sub": "user-1"}, audience=AUDIENCE)):
        r = await _start(signaling, auth(token))
        assert r.status_code == 403
        assert r.json() == {
            "type": "urn:dataplane:error:client_not_admitted",
            "title": "Client not admitted",
            "status": 403,
            "error": "client_not_admitted",
            "detail": "this client may not signal this data plane",
        }
    r = await signaling.client.get("/dps/registration", headers=auth(cp_token(STRANGER)))
    assert r.status_code == 403
    assert (await signaling.client.get("/dps/registration")).status_code == 401


async def test_dps02_an_empty_allowlist_admits_nobody(base_settings: dict[str, Any], cp_token: Any) -> None:
    async with run_app({**base_settings, "dps_control_plane_clients": []}) as app:
        r = await _start(app, auth(cp_token(CP)))
        assert r.status_code == 403
        assert r.json()["error"] == "client_not_admitted"


async def test_dps02_the_key_set_is_refetched_on_an_unknown_kid(signaling: Any, oidc: OidcIssuer) -> None:
    assert (await _start(signaling, auth(oidc.mint({"azp": CP}, audience=AUDIENCE)))).status_code == 200
    fetched = oidc.jwks_requests
    oidc.rotate()
    r = await _start(signaling, auth(oidc.mint({"azp": CP}, audience=AUDIENCE)))
    assert r.status_code == 200
    assert oidc.jwks_requests == fetched + 1
    # a known kid is served from the cache
    assert (await _start(signaling, auth(oidc.mint({"azp": CP}, audience=AUDIENCE)))).status_code == 200
    assert oidc.jwks_requests == fetched + 1


async def test_gs02_refused_signals_write_an_access_record_without_the_token(
    signaling: Any, cp_token: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dataplane.audit")
    stranger = cp_token(STRANGER)
    await _start(signaling, {})
    await _start(signaling, auth("junk.token.value"))
    await _start(signaling, auth(stranger))
    flow = new_id()
    await _start(signaling, auth(cp_token(CP)), flow)
    await _start(signaling, auth(cp_token(CP)), flow)  # 409
    await signaling.client.post(f"{FLOWS}/start", json={"processId": "x"}, headers=auth(cp_token(CP)))  # 422
    records = [r.msg for r in caplog.records if r.name == "dataplane.audit"]
    assert all(isinstance(r, dict) for r in records)
    reasons = [(r["reason"], r["client_id"]) for r in records if isinstance(r, dict)]
    assert reasons == [
        ("no_token", None),
        ("invalid_token", None),
        ("client_not_admitted", STRANGER),
        ("flow_exists", CP),
        ("invalid_message", CP),
    ]
    for r in records:
        assert isinstance(r, dict)
        assert r["action"] == "dps.signal" and r["event"] == "denied" and r["outcome"] == "denied"
        assert r["route"] == "/dps/v1/dataflows/start"
    text = caplog.text + "".join(str(r) for r in records)
    assert stranger not in text and "junk.token.value" not in text


# Every /dps route, as (method, path template); {id} is filled with a fresh flow/control-plane id.
ROUTES = [
    ("POST", f"{FLOWS}/prepare"),
    ("POST", f"{FLOWS}/start"),
    ("POST", f"{FLOWS}/{{id}}/started"),
    ("POST", f"{FLOWS}/{{id}}/suspend"),
    ("POST", f"{FLOWS}/{{id}}/resume"),
    ("POST", f"{FLOWS}/{{id}}/terminate"),
    ("POST", f"{FLOWS}/{{id}}/completed"),
    ("GET", f"{FLOWS}/{{id}}/status"),
    ("GET", "/dps/registration"),
    ("PUT", "/dps/v1/controlplanes"),
    ("DELETE", "/dps/v1/controlplanes/{id}"),
]
# Bodies that would each be refused as invalid_message if the body were looked at first.
BODIES = ['{"processId": ', "[1, 2]", '{"processId": 7}', "not json at all"]


def _audit_records(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    records = [r.msg for r in caplog.records if r.name == "dataplane.audit"]
    assert all(isinstance(r, dict) for r in records)
    return [r for r in records if isinstance(r, dict)]


@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize(
    ("credential", "status", "code"),
    [
        ("none", 401, "no_token"),
        ("junk", 401, "invalid_token"),
        ("stranger", 403, "client_not_admitted"),
    ],
)
async def test_dps02_authentication_comes_before_the_body_on_every_route(
    signaling: Any,
    cp_token: Any,
    caplog: pytest.LogCaptureFixture,
    method: str,
    path: str,
    credential: str,
    status: int,
    code: str,
) -> None:
    """FastAPI parses a JSON body before dependencies run; an unauthenticated caller must still
    get its 401/403 (not 422 invalid_message), and the refusal its GS-02 record."""
    caplog.set_level(logging.INFO, logger="dataplane.audit")
    token = {"none": None, "junk": "junk.token.value", "stranger": cp_token(STRANGER)}[credential]
    headers = {"Content-Type": "application/json"} | ({} if token is None else auth(token))
    url = path.replace("{id}", new_id())
    for body in BODIES:
        r = await signaling.client.request(method, url, content=body, headers=headers)
        assert r.status_code == status, (body, r.text)
        assert r.json()["error"] == code
    records = _audit_records(caplog)
    assert [(rec["reason"], rec["status"], rec["action"]) for rec in records] == [
        (code, status, "dps.signal")
    ] * len(BODIES)
    assert {rec["method"] for rec in records} == {method}
    assert {rec["client_id"] for rec in records} == {STRANGER if credential == "stranger" else None}
    if token is not None:
        assert token not in caplog.text + "".join(str(rec) for rec in records)


async def _flow_not_found(app: Any, token: str) -> Any:
    return await app.client.post(f"{FLOWS}/{new_id()}/suspend", json={}, headers=auth(token))


async def _invalid_transition(app: Any, token: str) -> Any:
    flow = new_id()
    assert (await app.client.post(f"{FLOWS}/start", json=start_message(flow), headers=auth(token))).is_success
    return await app.client.post(f"{FLOWS}/{flow}/resume", json={}, headers=auth(token))  # running


async def _control_plane_not_found(app: Any, token: str) -> Any:
    return await app.client.delete(f"/dps/v1/controlplanes/cp-{new_id()}", headers=auth(token))


async def _control_plane_taken(app: Any, token: str, other: str) -> Any:
    body = {"controlplaneId": f"cp-{new_id()}", "endpoint": "https://cp.example/api"}
    assert (await app.client.put("/dps/v1/controlplanes", json=body, headers=auth(token))).is_success
    return await app.client.put("/dps/v1/controlplanes", json=body, headers=auth(other))


async def _data_address_required(app: Any, token: str) -> Any:
    flow = new_id()
    assert (
        await app.client.post(f"{FLOWS}/prepare", json=start_message(flow), headers=auth(token))
    ).is_success
    return await app.client.post(f"{FLOWS}/{flow}/started", json={}, headers=auth(token))


async def _data_address_not_allowed(app: Any, token: str) -> Any:
    msg = start_message(new_id(), dataAddress=consumer_address("address-credential-value"))
    return await app.client.post(f"{FLOWS}/start", json=msg, headers=auth(token))


async def _flow_exists(app: Any, token: str) -> Any:
    msg = start_message(new_id())
    assert (await app.client.post(f"{FLOWS}/start", json=msg, headers=auth(token))).is_success
    return await app.client.post(f"{FLOWS}/start", json=msg, headers=auth(token))


async def _unsupported_transfer_type(app: Any, token: str) -> Any:
    msg = start_message(new_id(), transferType="HttpData-PUSH")
    return await app.client.post(f"{FLOWS}/start", json=msg, headers=auth(token))


async def _invalid_message(app: Any, token: str) -> Any:
    return await app.client.post(f"{FLOWS}/prepare", json={"processId": new_id()}, headers=auth(token))


REFUSALS: dict[str, tuple[int, str, Any]] = {
    "flow_not_found": (404, f"{FLOWS}/{{flow_id}}/suspend", _flow_not_found),
    "invalid_transition": (409, f"{FLOWS}/{{flow_id}}/resume", _invalid_transition),
    "control_plane_not_found": (404, "/dps/v1/controlplanes/{controlplane_id}", _control_plane_not_found),
    "control_plane_taken": (409, "/dps/v1/controlplanes", _control_plane_taken),
    "data_address_required": (400, f"{FLOWS}/{{flow_id}}/started", _data_address_required),
    "data_address_not_allowed": (400, f"{FLOWS}/start", _data_address_not_allowed),
    "flow_exists": (409, f"{FLOWS}/start", _flow_exists),
    "unsupported_transfer_type": (400, f"{FLOWS}/start", _unsupported_transfer_type),
    "invalid_message": (422, f"{FLOWS}/prepare", _invalid_message),
}


@pytest.mark.parametrize("code", REFUSALS)
async def test_gs02_every_refusal_code_writes_a_dps_signal_record_without_a_token(
    signaling: Any, cp_token: Any, caplog: pytest.LogCaptureFixture, code: str
) -> None:
    status, route, refuse = REFUSALS[code]
    token, other = cp_token(CP), cp_token(OTHER_CP)
    caplog.set_level(logging.INFO, logger="dataplane.audit")
    r = await (refuse(signaling, token, other) if code == "control_plane_taken" else refuse(signaling, token))
    assert (r.status_code, r.json()["error"]) == (status, code)
    (record,) = _audit_records(caplog)  # the set-up signals succeeded: only the refusal is recorded
    assert record["action"] == "dps.signal"
    assert (record["reason"], record["status"], record["outcome"]) == (code, status, "denied")
    assert record["route"] == route
    assert record["client_id"] == (OTHER_CP if code == "control_plane_taken" else CP)
    text = caplog.text + str(record)
    for secret in (token, other, "address-credential-value"):
        assert secret not in text


async def test_every_answer_carries_the_request_id_of_its_record(
    signaling: Any, cp_token: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """X-Request-ID on every signaling answer (docs/wire-contracts.md, "Errors"): a sane one echoed,
    else a new one; a refusal's GS-02 record names the same id."""
    caplog.set_level(logging.INFO, logger="dataplane.audit")
    ok = await _start(signaling, {**auth(cp_token(CP)), "X-Request-ID": "cp-call-1"})
    assert (ok.status_code, ok.headers["x-request-id"]) == (200, "cp-call-1")
    refused = await _start(signaling, {"X-Request-ID": "bad id with spaces"})
    assert refused.status_code == 401 and refused.headers["content-type"] == "application/problem+json"
    rid = refused.headers["x-request-id"]
    assert rid != "bad id with spaces" and len(rid) == 32
    assert [r["request_id"] for r in _audit_records(caplog)] == [rid]
    health = await signaling.client.get("/healthz")
    assert len(health.headers["x-request-id"]) == 32
