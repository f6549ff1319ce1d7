"""The shared OIDC issuer double behaves like Keycloak where services depend on it."""

from __future__ import annotations

import httpx
import jwt

from dataplane_local.doubles.oidc import OidcIssuer, start_oidc_issuer


async def test_the_issuer_double_serves_discovery_jwks_and_client_credentials(oidc: OidcIssuer) -> None:
    async with httpx.AsyncClient(base_url=oidc.base_url) as http:
        doc = (await http.get("/.well-known/openid-configuration")).json()
        assert doc["issuer"] == oidc.base_url
        assert doc["token_endpoint"] == oidc.base_url + "/protocol/openid-connect/token"
        assert doc["jwks_uri"] == oidc.base_url + "/protocol/openid-connect/certs"
        form = {"grant_type": "client_credentials", "client_id": "dataplane-signaling"}
        refused = await http.post("/protocol/openid-connect/token", data={**form, "client_secret": "wrong"})
        assert refused.status_code == 401
        basic = httpx.BasicAuth("dataplane-signaling", "signaling-secret")
        r = await http.post(
            "/protocol/openid-connect/token", data={"grant_type": "client_credentials"}, auth=basic
        )
        assert r.status_code == 200
        token = r.json()["access_token"]
        jwks = (await http.get("/protocol/openid-connect/certs")).json()
    key = jwt.PyJWK.from_dict(
        next(k for k in jwks["keys"] if k["kid"] == jwt.get_unverified_header(token)["kid"])
    )
    claims = jwt.decode(token, key.key, algorithms=["ES256"], audience="svc-signaling", issuer=oidc.base_url)
    assert claims["azp"] == claims["client_id"] == "dataplane-signaling"
    assert claims["gty"] == "client-credentials"
    assert claims["preferred_username"] == "service-account-dataplane-signaling"


def test_an_rsa_issuer_signs_rs256() -> None:
    issuer, server = start_oidc_issuer(key_type="RSA")
    try:
        token = issuer.mint({"sub": "u1"}, audience="a")
        assert jwt.get_unverified_header(token)["alg"] == "RS256"
        key = jwt.PyJWK.from_dict(issuer.jwks()["keys"][0])
        assert jwt.decode(token, key.key, algorithms=["RS256"], audience="a")["sub"] == "u1"
    finally:
        server.stop()
