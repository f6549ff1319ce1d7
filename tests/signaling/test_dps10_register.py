"""DPS-10 — `signaling register` sends EDC's data-plane registration to a control plane: the real
command in its own process, against a real HTTP control-plane double and OIDC issuer double."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import jwt
import pytest

from dataplane_local.doubles.control_plane import ControlPlaneDouble, start_control_plane
from dataplane_local.doubles.oidc import OidcIssuer
from dataplane_local.timeouts import scaled
from dataplane_testing.signaling import SERVICE_CLIENT, SERVICE_SECRET

CP_SECRET = "cp-secret-never-printed"
API_KEY = "edc-management-key-never-printed"


@pytest.fixture
def issuer(oidc: OidcIssuer) -> OidcIssuer:
    return oidc


def _env(issuer: OidcIssuer, cp_url: str, **extra: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("DPS_", "EDC_", "CELINE_"))}
    return {
        **keep,
        "EDC_REGISTRATION_URL": f"{cp_url}/api/management/v4/dataplanes",
        "EDC_REGISTRATION_ALLOW_HTTP": "true",
        "DPS_DATAPLANE_ID": "dataplane-7",
        "DPS_SIGNALING_URL": "https://dataplane.example.org/signaling/",
        "DPS_TRANSFER_TYPES": "HttpData-PULL,http-pull",
        "DPS_LABELS": "sql,eu",
        "DPS_CONTROL_PLANE_CLIENTS": "edc-cp,other",
        "DPS_REGISTRATION_CLIENT_ID": "edc-cp",
        "DPS_REGISTRATION_CLIENT_SECRET": CP_SECRET,
        "CELINE_OIDC_BASE_URL": issuer.base_url,
        "CELINE_OIDC_CLIENT_ID": SERVICE_CLIENT,
        "CELINE_OIDC_CLIENT_SECRET": SERVICE_SECRET,
        **extra,
    }


def _register(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "signaling", "register"],
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=False,
    )


def test_dps10_register_sends_rc2_and_rc3_lists_and_the_authorization_profile(
    issuer: OidcIssuer, control_plane: tuple[ControlPlaneDouble, str]
) -> None:
    cp, url = control_plane
    run = _register(_env(issuer, url))
    assert run.returncode == 0, run.stderr
    assert "registered data plane 'dataplane-7'" in run.stdout
    (reg,) = cp.registrations
    assert reg.path == "/api/management/v4/dataplanes"
    # each release's field holds its own values: RC2 the names, RC3 the profile URIs
    assert reg.body == {
        "dataplaneId": "dataplane-7",
        "endpoint": "https://dataplane.example.org/signaling/dps/v1/dataflows",
        "transferTypes": ["HttpData-PULL"],
        "profiles": ["https://w3id.org/dspace-sig/profile/http-pull"],
        "labels": ["sql", "eu"],
        "authorization": [
            {
                "type": "oauth2_client_credentials",
                "tokenEndpoint": f"{issuer.base_url}/protocol/openid-connect/token",
                "clientId": "edc-cp",
                "clientSecret": CP_SECRET,
                "jwksUri": f"{issuer.base_url}/protocol/openid-connect/certs",
            }
        ],
    }
    # no API key configured: signaling's own client-credentials token from the issuer
    assert reg.api_key is None
    assert reg.authorization is not None and reg.authorization.startswith("Bearer ")
    claims: dict[str, Any] = jwt.decode(reg.authorization[7:], options={"verify_signature": False})
    assert claims["iss"] == issuer.base_url
    assert SERVICE_CLIENT in (claims.get("azp"), claims.get("client_id"))
    assert CP_SECRET not in run.stdout + run.stderr


@pytest.mark.parametrize(
    ("spelling", "present", "absent"),
    [("rc2", "transferTypes", "profiles"), ("rc3", "profiles", "transferTypes")],
)
def test_dps10_register_speaks_one_rc_when_told(
    issuer: OidcIssuer,
    control_plane: tuple[ControlPlaneDouble, str],
    spelling: str,
    present: str,
    absent: str,
) -> None:
    cp, url = control_plane
    run = _register(_env(issuer, url, EDC_REGISTRATION_SPELLING=spelling, EDC_REGISTRATION_API_KEY=API_KEY))
    assert run.returncode == 0, run.stderr
    (reg,) = cp.registrations
    assert present in reg.body and absent not in reg.body
    assert reg.api_key == API_KEY and reg.authorization is None


def test_dps10_register_refuses_a_spelling_with_nothing_of_its_release_to_send(
    issuer: OidcIssuer, control_plane: tuple[ControlPlaneDouble, str]
) -> None:
    cp, url = control_plane
    env = _env(issuer, url, EDC_REGISTRATION_SPELLING="rc3", DPS_TRANSFER_TYPES="HttpData-PULL")
    run = _register(env)
    assert run.returncode == 2
    assert "EDC_REGISTRATION_SPELLING=rc3 has nothing to send" in run.stderr
    assert cp.registrations == []


def test_dps10_register_a_refusal_fails_the_job_without_echoing_secrets(
    issuer: OidcIssuer, control_plane: tuple[ControlPlaneDouble, str]
) -> None:
    cp, url = control_plane
    cp.registration_status = 409  # and the double reflects the body, secret included
    run = _register(_env(issuer, url, EDC_REGISTRATION_API_KEY=API_KEY))
    assert run.returncode == 1
    assert "control plane answered 409" in run.stderr
    assert CP_SECRET not in run.stdout + run.stderr and API_KEY not in run.stdout + run.stderr


def test_dps10_register_an_unreachable_control_plane_fails(issuer: OidcIssuer) -> None:
    _cp, server = start_control_plane()
    url = server.url
    server.stop()
    run = _register(_env(issuer, url, EDC_REGISTRATION_API_KEY=API_KEY))
    assert run.returncode == 1
    assert "control plane unreachable" in run.stderr


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        # a client signaling would refuse: every signal of that control plane would fail
        ({"DPS_REGISTRATION_CLIENT_ID": "stranger"}, "must be one of DPS_CONTROL_PLANE_CLIENTS"),
        ({"EDC_REGISTRATION_ALLOW_HTTP": "false"}, "EDC_REGISTRATION_URL must be https"),
        ({"DPS_TRANSFER_TYPES": "HttpData-PUSH"}, "DPS_TRANSFER_TYPES"),
        ({"EDC_REGISTRATION_SPELLING": "rc4"}, "EDC_REGISTRATION_SPELLING"),
    ],
)
def test_dps10_register_refuses_a_configuration_it_cannot_honour(
    issuer: OidcIssuer, control_plane: tuple[ControlPlaneDouble, str], change: dict[str, str], expected: str
) -> None:
    cp, url = control_plane
    run = _register(_env(issuer, url, **change))
    assert run.returncode == 2
    assert expected in run.stderr
    assert cp.registrations == []
    assert CP_SECRET not in run.stderr


def test_dps10_register_needs_credentials_for_the_control_plane(
    issuer: OidcIssuer, control_plane: tuple[ControlPlaneDouble, str]
) -> None:
    cp, url = control_plane
    env = _env(issuer, url)
    del env["CELINE_OIDC_CLIENT_SECRET"]
    run = _register(env)
    assert run.returncode == 1
    assert "no credentials for the control plane" in run.stderr
    assert cp.registrations == []
