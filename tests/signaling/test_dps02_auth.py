"""DPS-02 — only admitted control planes may signal; refusals are audited (GS-02)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from signaling_support import AUDIENCE, CP, FLOWS, OTHER_CP, STRANGER, auth, new_id, run_app, start_message

from dataplane_local.doubles.oidc import OidcIssuer


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
        assert r.json() == {"error": "invalid_token", "detail": "signalling token is not valid"}


async def test_dps02_a_client_not_listed_is_403(signaling: Any, oidc: OidcIssuer, cp_token: Any) -> None:
    for token in (cp_token(STRANGER), oidc.mint({"sub": "user-1"}, audience=AUDIENCE)):
        r = await _start(signaling, auth(token))
        assert r.status_code == 403
        assert r.json() == {
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
