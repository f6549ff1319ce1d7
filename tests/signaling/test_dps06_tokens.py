"""DPS-06 — the pull token: ES256, jti/aud/iss=sub/iat, no exp, one live token per flow."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from dataplane_testing.signaling import FLOWS, auth, live_grants, new_id, run_app, start_message, token_of
from signaling.tokens import public_key_pem


async def test_dps06_claims_follow_edc_data_plane_iam(
    signaling: Any, cp_token: Any, signing_key: ec.EllipticCurvePrivateKey
) -> None:
    r = await signaling.client.post(f"{FLOWS}/start", json=start_message(new_id()), headers=auth(cp_token()))
    token = token_of(r.json())
    header = jwt.get_unverified_header(token)
    assert header["alg"] == "ES256" and "kid" not in header
    claims = jwt.decode(
        token,
        signing_key.public_key(),
        algorithms=["ES256"],
        audience="did:web:consumer.example",
        options={"require": ["jti", "iat", "iss", "sub", "aud"]},
    )
    assert set(claims) == {"jti", "aud", "iss", "sub", "iat"}  # no exp, no flow facts
    assert claims["iss"] == claims["sub"] == "did:web:provider.example"
    assert claims["aud"] == "did:web:consumer.example"


async def test_dps06_the_token_is_bound_to_its_flow_by_jti(
    signaling: Any, cp_token: Any, signing_key: ec.EllipticCurvePrivateKey
) -> None:
    flow = new_id()
    r = await signaling.client.post(f"{FLOWS}/start", json=start_message(flow), headers=auth(cp_token()))
    jti = jwt.decode(token_of(r.json()), options={"verify_signature": False})["jti"]
    grants = await live_grants(signaling.settings.database_url.replace("+asyncpg", ""))
    assert grants[jti]["flow_id"] == flow
    assert [g for g in grants.values() if g["flow_id"] == flow] == [grants[jti]]


async def test_dps06_a_configured_kid_is_stamped(base_settings: dict[str, Any], cp_token: Any) -> None:
    async with run_app({**base_settings, "dps_token_key_id": "dps-2026"}) as app:
        r = await app.client.post(f"{FLOWS}/start", json=start_message(new_id()), headers=auth(cp_token()))
        assert jwt.get_unverified_header(token_of(r.json()))["kid"] == "dps-2026"


async def test_dps06_another_key_does_not_verify_the_token(signaling: Any, cp_token: Any) -> None:
    r = await signaling.client.post(f"{FLOWS}/start", json=start_message(new_id()), headers=auth(cp_token()))
    other = ec.generate_private_key(ec.SECP256R1()).public_key()
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(token_of(r.json()), other, algorithms=["ES256"], options={"verify_aud": False})


async def test_dps06_a_configured_key_survives_a_restart(
    base_settings: dict[str, Any], cp_token: Any, signing_key: ec.EllipticCurvePrivateKey
) -> None:
    tokens = []
    for _ in range(2):
        async with run_app(base_settings) as app:
            r = await app.client.post(
                f"{FLOWS}/start", json=start_message(new_id()), headers=auth(cp_token())
            )
            tokens.append(token_of(r.json()))
    for t in tokens:
        jwt.decode(t, signing_key.public_key(), algorithms=["ES256"], audience="did:web:consumer.example")


async def test_dps06_public_key_subcommand_prints_the_verifying_key(
    signing_pem: str, signing_key: ec.EllipticCurvePrivateKey
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPS_")}

    def run(pem: str | None) -> subprocess.CompletedProcess[str]:
        e = dict(env)
        if pem is not None:
            e["DPS_TOKEN_SIGNING_KEY"] = pem
        return subprocess.run(
            [sys.executable, "-m", "signaling", "public-key"],
            env=e,
            capture_output=True,
            text=True,
            check=False,
        )

    done = await asyncio.to_thread(run, signing_pem)
    assert done.returncode == 0, done.stderr
    assert done.stdout == public_key_pem(signing_key)
    assert "PRIVATE" not in done.stdout
    public = load_pem_public_key(done.stdout.encode())
    token = jwt.encode({"x": 1}, signing_key, algorithm="ES256")
    assert jwt.decode(token, public, algorithms=["ES256"]) == {"x": 1}
    missing = await asyncio.to_thread(run, None)
    assert missing.returncode == 2 and "DPS_TOKEN_SIGNING_KEY" in missing.stderr
