"""DPS-11 — control-plane registration: replace semantics, ownership per caller, no profile stored."""

from __future__ import annotations

from typing import Any

from dataplane_testing.signaling import OTHER_CP, auth, sql

SECRET = "cp-client-secret-value"


def _registration(cp_id: str, endpoint: str = "https://cp.example/api") -> dict[str, Any]:
    return {
        "controlplaneId": cp_id,
        "endpoint": endpoint,
        "authorization": [
            {
                "type": "oauth2_client_credentials",
                "tokenEndpoint": "https://idp/token",
                "clientId": "cp",
                "clientSecret": SECRET,
            }
        ],
    }


def _db(app: Any) -> str:
    return str(app.settings.database_url).replace("+asyncpg", "")


async def test_dps11_register_replace_and_delete(signaling: Any, cp_token: Any) -> None:
    c = signaling.client
    r = await c.put("/dps/v1/controlplanes", json=_registration("cp-1"), headers=auth(cp_token()))
    assert r.status_code == 200 and r.content == b""
    r = await c.put(
        "/dps/v1/controlplanes", json=_registration("cp-1", "https://cp2.example"), headers=auth(cp_token())
    )
    assert r.status_code == 200
    rows = await sql(_db(signaling), "SELECT endpoint FROM dps_control_planes WHERE controlplane_id='cp-1'")
    assert [r["endpoint"] for r in rows] == ["https://cp2.example"]
    assert (await c.delete("/dps/v1/controlplanes/cp-1", headers=auth(cp_token()))).status_code == 204
    r = await c.delete("/dps/v1/controlplanes/cp-1", headers=auth(cp_token()))
    assert r.status_code == 404
    assert r.json()["error"] == "control_plane_not_found"


async def test_dps11_another_callers_registration_is_theirs(signaling: Any, cp_token: Any) -> None:
    c = signaling.client
    assert (
        await c.put("/dps/v1/controlplanes", json=_registration("cp-x"), headers=auth(cp_token()))
    ).status_code == 200
    r = await c.put(
        "/dps/v1/controlplanes", json=_registration("cp-x", "https://evil"), headers=auth(cp_token(OTHER_CP))
    )
    assert r.status_code == 409
    assert r.json()["error"] == "control_plane_taken"
    r = await c.delete("/dps/v1/controlplanes/cp-x", headers=auth(cp_token(OTHER_CP)))
    assert r.status_code == 404
    rows = await sql(_db(signaling), "SELECT endpoint, registered_by FROM dps_control_planes")
    assert [(r["endpoint"], r["registered_by"]) for r in rows] == [
        ("https://cp.example/api", "edc-control-plane")
    ]


async def test_dps11_no_authorization_profile_is_stored(signaling: Any, cp_token: Any) -> None:
    await signaling.client.put("/dps/v1/controlplanes", json=_registration("cp-s"), headers=auth(cp_token()))
    rows = await sql(_db(signaling), "SELECT row_to_json(c)::text AS j FROM dps_control_planes c")
    assert rows and all(SECRET not in r["j"] and "oauth2" not in r["j"] for r in rows)


async def test_dps11_a_registration_needs_its_id_and_endpoint(signaling: Any, cp_token: Any) -> None:
    for body in ({"endpoint": "https://e"}, {"controlplaneId": "x"}, {"controlplaneId": "", "endpoint": "e"}):
        r = await signaling.client.put("/dps/v1/controlplanes", json=body, headers=auth(cp_token()))
        assert r.status_code == 422
        assert r.json()["error"] == "invalid_message"
