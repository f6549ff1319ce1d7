"""DPS-01 — off unless enabled; enabled without a (usable) signing key fails start-up."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from pydantic import ValidationError

from dataplane_service_kit.settings import describe_validation_error
from dataplane_testing.signaling import FLOWS, auth, process_env, run_app, start_message
from signaling.migrate import DatabaseNotAtHead
from signaling.settings import Settings


async def test_dps01_off_by_default(base_settings: dict[str, Any], cp_token: Any) -> None:
    values = {k: v for k, v in base_settings.items() if k != "dps_enabled"}
    async with run_app(values) as app:
        assert (await app.client.get("/healthz")).status_code == 200
        r = await app.client.post(f"{FLOWS}/start", json=start_message("f"), headers=auth(cp_token()))
        assert r.status_code == 404
        assert (await app.client.get("/dps/registration", headers=auth(cp_token()))).status_code == 404
        assert (await app.client.put("/dps/v1/controlplanes", json={})).status_code == 404


async def test_dps01_mounted_when_enabled(signaling: Any, cp_token: Any) -> None:
    r = await signaling.client.get("/dps/registration", headers=auth(cp_token()))
    assert r.status_code == 200
    ready = await signaling.client.get("/readyz")
    assert ready.status_code == 200, ready.text


def _settings_error(values: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as info:
        Settings(**values)
    return describe_validation_error(info.value, Settings)


def test_dps01_enabled_without_a_signing_key_fails_at_startup(base_settings: dict[str, Any]) -> None:
    message = _settings_error({**base_settings, "dps_token_signing_key": None})
    assert "DPS_TOKEN_SIGNING_KEY" in message


def test_dps01_a_non_ec_key_is_rejected_at_startup(base_settings: dict[str, Any]) -> None:
    rsa_pem = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        .private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
        .decode()
    )
    p384 = (
        ec.generate_private_key(ec.SECP384R1())
        .private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
        .decode()
    )
    for pem in (rsa_pem, p384, "not a key"):
        message = _settings_error({**base_settings, "dps_token_signing_key": pem})
        assert "DPS_TOKEN_SIGNING_KEY" in message
        assert "PRIVATE KEY" not in message  # the value is never echoed


def test_dps01_a_push_data_plane_cannot_be_configured(base_settings: dict[str, Any]) -> None:
    message = _settings_error({**base_settings, "dps_transfer_types": ["HttpData-PULL", "HttpData-PUSH"]})
    assert "DPS_TRANSFER_TYPES" in message


def test_dps01_lists_are_read_as_json_or_comma_separated(base_settings: dict[str, Any]) -> None:
    s = Settings(**{**base_settings, "dps_control_plane_clients": "a, b", "dps_labels": '["x"]'})
    assert s.dps_control_plane_clients == ["a", "b"] and s.dps_labels == ["x"]


async def test_dps01_the_server_process_refuses_to_start_without_a_key(base_settings: dict[str, Any]) -> None:
    env = process_env({**base_settings, "dps_token_signing_key": None}, port=1)

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "signaling"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    done = await asyncio.to_thread(run)
    assert done.returncode == 2
    assert "DPS_TOKEN_SIGNING_KEY" in done.stderr


async def test_dps13_a_database_not_at_head_refuses_start(
    base_settings: dict[str, Any], fresh_database: str
) -> None:
    with pytest.raises(DatabaseNotAtHead, match="signaling-migrate"):
        async with run_app({**base_settings, "database_url": fresh_database}):
            pass
