"""The REC registry development double answers as specified, over real HTTP (RF-11/RF-12 inputs)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dataplane_local.doubles.oidc import OidcIssuer, start_oidc_issuer
from dataplane_local.doubles.rec_registry import RecRegistryDouble, create_app
from dataplane_local.doubles.server import RunningServer, serve_in_thread
from dataplane_testing.processes import double_process

CONFIG: dict[str, Any] = {
    "members": {
        "alice": {
            "user_id": "u-alice",
            "assets": [
                {"key": "b-meter", "asset_type": "meter", "name": "B", "sensor_id": "POD-2"},
                {"key": "a-meter", "asset_type": "meter", "name": "A", "sensor_id": "POD-1"},
                {"key": "c-panel", "asset_type": "pv", "name": "PV", "sensor_id": None},
            ],
        },
        "bob": {"user_id": "u-bob", "assets": []},
    }
}


@pytest.fixture(scope="module")
def oidc() -> Iterator[OidcIssuer]:
    issuer, server = start_oidc_issuer(clients={"svc": "s3cret"})
    yield issuer
    server.stop()


@pytest.fixture
def rec() -> Iterator[tuple[RecRegistryDouble, RunningServer]]:
    state = RecRegistryDouble(CONFIG)
    server = serve_in_thread(create_app(state))
    yield state, server
    server.stop()


def assets(url: str, token: str | None, **params: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(f"{url}/user/assets", headers=headers, params=params)


def test_member_gets_own_assets_sorted_by_key(
    rec: tuple[RecRegistryDouble, RunningServer], oidc: OidcIssuer
) -> None:
    _, server = rec
    r = assets(server.url, oidc.mint({"preferred_username": "alice"}))
    assert r.status_code == 200
    body = r.json()
    assert body["total"] == 3 and [a["key"] for a in body["items"]] == ["a-meter", "b-meter", "c-panel"]
    assert body["items"][0] == {
        "key": "a-meter",
        "asset_type": "meter",
        "name": "A",
        "sensor_id": "POD-1",
        "properties": {},
        "device": {},
        "relationships": {},
    }
    assert body["items"][2]["sensor_id"] is None
    only_pv = assets(server.url, oidc.mint({"preferred_username": "alice"}), asset_type="pv").json()
    assert [a["key"] for a in only_pv["items"]] == ["c-panel"]
    # a member without assets (RF-11's input) is a 200 with no items
    assert assets(server.url, oidc.mint({"preferred_username": "bob"})).json() == {"items": [], "total": 0}


def test_rf12_non_member_gets_coded_403_and_missing_token_401(
    rec: tuple[RecRegistryDouble, RunningServer], oidc: OidcIssuer
) -> None:
    _, server = rec
    r = assets(server.url, oidc.mint({"preferred_username": "mallory"}))
    assert r.status_code == 403
    assert r.json() == {"detail": "You are not a member of any community", "code": "not_a_member"}
    assert assets(server.url, None).status_code == 401
    assert assets(server.url, "not-a-jwt").status_code == 401


def test_bearer_verified_against_oidc_jwks_when_configured(
    rec: tuple[RecRegistryDouble, RunningServer], oidc: OidcIssuer
) -> None:
    state, server = rec
    state.configure({**CONFIG, "jwks_url": f"{oidc.base_url}/protocol/openid-connect/certs"})
    from cryptography.hazmat.primitives.asymmetric import ec

    forged = oidc.mint({"preferred_username": "alice"}, sign_with=ec.generate_private_key(ec.SECP256R1()))
    assert assets(server.url, forged).status_code == 401
    assert assets(server.url, oidc.mint({"preferred_username": "alice"})).status_code == 200


def test_rf12_matrix_faults_programmable_in_process_and_over_http(
    rec: tuple[RecRegistryDouble, RunningServer], oidc: OidcIssuer
) -> None:
    state, server = rec
    token = oidc.mint({"preferred_username": "alice"})
    state.set_fault(endpoint="user_assets", status=403, body={"detail": "nope", "code": "forbidden"}, count=1)
    r = assets(server.url, token)
    assert (r.status_code, r.json()) == (403, {"detail": "nope", "code": "forbidden"})
    state.set_fault(
        endpoint="user_assets", status=403, body={"detail": "You are not a member of any community"}, count=1
    )
    assert assets(server.url, token).json() == {"detail": "You are not a member of any community"}
    httpx.post(
        f"{server.url}/_control",
        json={"action": "fault", "endpoint": "user_assets", "status": 403, "text": "Forbidden", "count": 1},
    )
    bare = assets(server.url, token)
    assert (
        bare.status_code == 403
        and bare.text == "Forbidden"
        and bare.headers["content-type"].startswith("text/plain")
    )
    httpx.post(
        f"{server.url}/_control",
        json={"action": "fault", "endpoint": "user_assets", "status": 500, "count": 1},
    )
    assert assets(server.url, token).status_code == 500
    assert assets(server.url, token).status_code == 200  # every fault used up
    recorded = [c["status"] for c in httpx.get(f"{server.url}/_calls").json()]
    assert recorded == [403, 403, 403, 500, 200]


def test_admin_lookup_by_user_ids(rec: tuple[RecRegistryDouble, RunningServer], oidc: OidcIssuer) -> None:
    _, server = rec
    headers = {"Authorization": f"Bearer {oidc.service_token('svc', scope='rec-registry.lookup')}"}
    url = f"{server.url}/admin/lookup/assets-by-user-ids"
    r = httpx.post(url, json={"user_ids": ["u-alice", "u-unknown", "u-bob"]}, headers=headers)
    assert r.status_code == 200
    rows = r.json()
    assert [(a["owner_user_id"], a["key"], a["sensor_id"]) for a in rows] == [
        ("u-alice", "a-meter", "POD-1"),
        ("u-alice", "b-meter", "POD-2"),
        ("u-alice", "c-panel", None),
    ]
    assert {"id", "owner_key", "community_key", "community_name", "properties"} <= set(rows[0])
    assert httpx.post(url, json={"user_ids": ["u-alice"]}).status_code == 401
    too_many = httpx.post(url, json={"user_ids": [f"u{i}" for i in range(501)]}, headers=headers)
    assert too_many.status_code == 422
    calls = httpx.get(f"{server.url}/_calls", params={"endpoint": "admin_lookup"}).json()
    assert calls[0]["body"] == {"user_ids": ["u-alice", "u-unknown", "u-bob"]}


def test_runs_as_a_process_and_members_set_over_http(tmp_path: Path, oidc: OidcIssuer) -> None:
    with double_process("dataplane_local.doubles.rec_registry", CONFIG, tmp_path) as url:
        token = oidc.mint({"preferred_username": "dave"})
        assert assets(url, token).status_code == 403
        member = {"action": "set_member", "username": "dave", "assets": [{"key": "k", "sensor_id": "POD-9"}]}
        assert httpx.post(f"{url}/_control", json=member).status_code == 200
        assert [a["sensor_id"] for a in assets(url, token).json()["items"]] == ["POD-9"]
