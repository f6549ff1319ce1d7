"""`signaling register`: send this data plane's registration to an EDC control plane (DPS-10).

The service itself never registers (docs/dps.md, DPS-10); an operator, or the chart's
registration Job, runs this once per release. It builds the registration body from the same
variables the service reads — `DPS_DATAPLANE_ID`, the signalling endpoint under
`DPS_SIGNALING_URL`, `DPS_TRANSFER_TYPES` (split: RC2 `transferTypes` holds the RC2 names such as
`HttpData-PULL`, RC3 `profiles` the profile URIs, docs/edc.md),
`DPS_LABELS` — and adds the authorization profile the control plane will use to call us: an
`oauth2_client_credentials` entry with our issuer's token endpoint and key set and the client the
control plane signs in as. That client must be one signaling admits (`DPS_CONTROL_PLANE_CLIENTS`),
and the key set is always sent, so the control plane never takes the profile's unverified mode.

The body is PUT to `EDC_REGISTRATION_URL`, authenticated with `EDC_REGISTRATION_API_KEY` (the
`X-Api-Key` header of EDC's management API) or else this service's own client-credentials token.
Exit 0 on a 2xx, 1 when the control plane refused or could not be reached, 2 on configuration.
The client secret travels only in that body: it is never printed or logged."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Literal

import httpx
from pydantic import AnyHttpUrl, Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from dataplane_contracts.dps import SIGNALING_PATH, canonical_transfer_type
from dataplane_contracts.settings import BASE_CONFIG, OidcSettings, OutboundTlsSettings
from dataplane_service_kit.oauth import TokenUnavailable, fetch_token
from dataplane_service_kit.outbound_tls import outbound_http_sync
from dataplane_service_kit.settings import load_settings
from signaling.settings import DpsIdentitySettings

Spelling = Literal["rc2", "rc3", "both"]
AUTH_PROFILE = "oauth2_client_credentials"


class RegisterSettings(OidcSettings, DpsIdentitySettings, OutboundTlsSettings):
    """What `signaling register` reads. No database or broker: the Job needs neither."""

    model_config = SettingsConfigDict(**BASE_CONFIG, validate_default=True)

    edc_registration_url: AnyHttpUrl
    edc_registration_api_key: SecretStr | None = None
    # RC2 names the list `transferTypes`, RC3 `profiles`; EDC releases in between read either
    edc_registration_spelling: Spelling = "both"
    edc_registration_timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    # tests and the local doubles only: a control plane and a signalling endpoint over plain HTTP
    edc_registration_allow_http: bool = False

    dps_signaling_url: AnyHttpUrl
    dps_registration_client_id: str = Field(min_length=1)
    dps_registration_client_secret: SecretStr

    @model_validator(mode="after")
    def _consistent(self) -> RegisterSettings:
        if self.dps_registration_client_id not in self.dps_control_plane_clients:
            raise ValueError(
                "DPS_REGISTRATION_CLIENT_ID must be one of DPS_CONTROL_PLANE_CLIENTS "
                "(signaling refuses every other client)"
            )
        rc2, rc3 = split_transfer_types(self.dps_transfer_types)
        wanted = {"rc2": rc2, "rc3": rc3, "both": rc2 + rc3}[self.edc_registration_spelling]
        if not wanted:
            raise ValueError(
                f"EDC_REGISTRATION_SPELLING={self.edc_registration_spelling} has nothing to send: "
                "DPS_TRANSFER_TYPES holds no "
                + (
                    "RC2 name (HttpData-PULL)"
                    if self.edc_registration_spelling == "rc2"
                    else "RC3 profile (http-pull)"
                )
            )
        if self.oidc_token_url() is None:
            raise ValueError("CELINE_OIDC_BASE_URL is required (the profile's token endpoint and key set)")
        if not self.edc_registration_allow_http:
            plain = [
                name
                for name, url in (
                    ("EDC_REGISTRATION_URL", self.edc_registration_url),
                    ("DPS_SIGNALING_URL", self.dps_signaling_url),
                )
                if url.scheme != "https"
            ]
            if plain:
                raise ValueError(f"{', '.join(plain)} must be https")
        return self


def split_transfer_types(types: Sequence[str]) -> tuple[list[str], list[str]]:
    """(RC2 transfer types, RC3 profiles) of DPS_TRANSFER_TYPES. RC3 renamed the list and made its
    values profile URIs (`https://w3id.org/dspace-sig/profile/http-pull`; `http-pull` is read as
    that URI); RC2's values are names such as `HttpData-PULL`. A control plane of one release must
    not be handed the other's values under its field."""
    rc2: list[str] = []
    rc3: list[str] = []
    for value in types:
        canonical = canonical_transfer_type(value)
        target = rc3 if "://" in canonical else rc2
        if canonical not in target:
            target.append(canonical)
    return rc2, rc3


def registration_body(settings: RegisterSettings) -> dict[str, Any]:
    """EDC's data-plane registration: the DPS-10 message plus the authorization profile."""
    rc2, rc3 = split_transfer_types(settings.dps_transfer_types)
    body: dict[str, Any] = {
        "dataplaneId": settings.dps_dataplane_id,
        "endpoint": str(settings.dps_signaling_url).rstrip("/") + SIGNALING_PATH,
    }
    if settings.edc_registration_spelling in ("rc2", "both") and rc2:
        body["transferTypes"] = rc2
    if settings.edc_registration_spelling in ("rc3", "both") and rc3:
        body["profiles"] = rc3
    body["labels"] = list(settings.dps_labels)
    body["authorization"] = [
        {
            "type": AUTH_PROFILE,
            "tokenEndpoint": settings.oidc_token_url(),
            "clientId": settings.dps_registration_client_id,
            "clientSecret": settings.dps_registration_client_secret.get_secret_value(),
            "jwksUri": settings.oidc_jwks_uri(),
        }
    ]
    return body


class RegistrationFailed(Exception):
    """The control plane refused, or could not be asked; the message carries no secret."""


def _credentials(settings: RegisterSettings, http: httpx.Client) -> dict[str, str]:
    if settings.edc_registration_api_key is not None:
        return {"X-Api-Key": settings.edc_registration_api_key.get_secret_value()}
    client_id, secret = settings.celine_oidc_client_id, settings.celine_oidc_client_secret
    if not client_id or secret is None:
        raise RegistrationFailed(
            "no credentials for the control plane: set EDC_REGISTRATION_API_KEY or "
            "CELINE_OIDC_CLIENT_ID and CELINE_OIDC_CLIENT_SECRET"
        )
    token_url = settings.oidc_token_url()
    assert token_url is not None  # checked by the settings
    try:
        token = fetch_token(http, token_url, client_id, secret.get_secret_value())
    except TokenUnavailable as exc:  # names the issuer's status or the transport error's class only
        raise RegistrationFailed(str(exc)) from None
    return {"Authorization": f"Bearer {token}"}


def register(settings: RegisterSettings) -> int:
    """PUT the registration; the control plane's status code, or RegistrationFailed."""
    url = str(settings.edc_registration_url)
    with outbound_http_sync(settings, timeout=settings.edc_registration_timeout_seconds) as http:
        headers = _credentials(settings, http)
        try:
            answer = http.put(url, json=registration_body(settings), headers=headers)
        except httpx.HTTPError as exc:
            raise RegistrationFailed(f"control plane unreachable: {type(exc).__name__}") from None
    if not answer.is_success:
        # the answer's body is not echoed: a control plane may reflect the request, secret included
        raise RegistrationFailed(f"control plane answered {answer.status_code}")
    return answer.status_code


def main() -> None:
    settings = load_settings(RegisterSettings)
    try:
        status = register(settings)
    except RegistrationFailed as exc:
        print(f"registration failed: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    print(
        f"registered data plane {settings.dps_dataplane_id!r} at {settings.edc_registration_url} ({status})"
    )
