"""A small but real OIDC issuer (Keycloak-shaped paths) for tests and the local stack.

Services are configured against it exactly as against Keycloak:

    CELINE_OIDC_BASE_URL   = issuer.base_url   (the issuer: `iss` of every token it mints)
    CELINE_OIDC_JWKS_URI   = optional; when unset a service reads `jwks_uri` from
                             `{base}/.well-known/openid-configuration`
                             (here `{base}/protocol/openid-connect/certs`)
    CELINE_OIDC_AUDIENCE   = the `aud` the service requires (pass it as `audience=` to `mint`)
    CELINE_OIDC_CLIENT_ID / CELINE_OIDC_CLIENT_SECRET = a client registered with `add_client`

Endpoints: `GET /.well-known/openid-configuration`, `GET /protocol/openid-connect/certs` (JWKS),
`POST /protocol/openid-connect/token` (client_credentials; client id/secret in the form or as
HTTP Basic). `mint(...)` makes any user or service token in-process; `rotate()` switches to a new
signing key with a new `kid` (the old key leaves the JWKS unless `keep_old=True`), so tests can
prove a verifier refetches the key set on an unknown `kid`.

Usage:

    issuer, server = start_oidc_issuer(clients={"edc": "secret"})
    token = issuer.mint({"azp": "edc"}, audience="svc-signaling")
    ...
    server.stop()
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qs

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from dataplane_local.doubles.server import RunningServer, serve_in_thread
from dataplane_local.infra import free_port

KeyType = Literal["EC", "RSA"]
TOKEN_PATH = "/protocol/openid-connect/token"
JWKS_PATH = "/protocol/openid-connect/certs"
DISCOVERY_PATH = "/.well-known/openid-configuration"

_PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


@dataclass
class _Key:
    kid: str
    private: _PrivateKey
    alg: str

    def jwk(self) -> dict[str, Any]:
        algo: Any = jwt.algorithms.ECAlgorithm if self.alg == "ES256" else jwt.algorithms.RSAAlgorithm
        data: dict[str, Any] = json.loads(algo.to_jwk(self.private.public_key()))
        data.update({"kid": self.kid, "use": "sig", "alg": self.alg})
        return data


def _new_key(key_type: KeyType) -> _Key:
    kid = uuid.uuid4().hex[:16]
    if key_type == "EC":
        return _Key(kid, ec.generate_private_key(ec.SECP256R1()), "ES256")
    return _Key(kid, rsa.generate_private_key(public_exponent=65537, key_size=2048), "RS256")


@dataclass
class OidcIssuer:
    """An issuer holding one active signing key (plus any kept after rotation)."""

    base_url: str
    key_type: KeyType = "EC"
    clients: dict[str, str] = field(default_factory=dict)
    default_audience: str | None = None
    token_lifetime: int = 300
    _keys: list[_Key] = field(default_factory=list, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    token_requests: int = field(default=0, init=False)
    jwks_requests: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.base_url = self.base_url.rstrip("/")
        self._keys.append(_new_key(self.key_type))

    # -------------------------------------------------------------- keys
    @property
    def kid(self) -> str:
        return self._keys[-1].kid

    def rotate(self, keep_old: bool = False) -> str:
        """Sign with a fresh key from now on; returns its kid."""
        with self._lock:
            new = _new_key(self.key_type)
            self._keys = [*self._keys, new] if keep_old else [new]
            return new.kid

    def jwks(self) -> dict[str, Any]:
        return {"keys": [k.jwk() for k in self._keys]}

    def add_client(self, client_id: str, secret: str) -> None:
        self.clients[client_id] = secret

    # -------------------------------------------------------------- tokens
    def mint(
        self,
        claims: dict[str, Any] | None = None,
        *,
        audience: str | list[str] | None = None,
        expires_in: int | None = None,
        kid: str | None = None,
        issuer: str | None = None,
        sign_with: _PrivateKey | None = None,
    ) -> str:
        """A signed JWT with `iss`, `iat`, `exp`, `jti` and `aud` filled in unless given.

        `expires_in` may be negative (an expired token); `kid` overrides the header only (to
        forge an unknown kid); `sign_with` signs with a foreign key (a forged token)."""
        key = self._keys[-1]
        now = int(time.time())
        body: dict[str, Any] = {
            "iss": issuer or self.base_url,
            "iat": now,
            "exp": now + (self.token_lifetime if expires_in is None else expires_in),
            "jti": str(uuid.uuid4()),
        }
        aud = audience if audience is not None else self.default_audience
        if aud is not None:
            body["aud"] = aud
        body.update(claims or {})
        headers = {"kid": kid or key.kid}
        return jwt.encode(body, sign_with or key.private, algorithm=key.alg, headers=headers)

    def service_token(self, client_id: str, audience: str | None = None, scope: str = "") -> str:
        """The token a client-credentials grant returns, shaped like Keycloak's."""
        claims: dict[str, Any] = {
            "sub": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{self.base_url}/{client_id}")),
            "azp": client_id,
            "client_id": client_id,
            "gty": "client-credentials",
            "preferred_username": f"service-account-{client_id}",
            "typ": "Bearer",
            "scope": scope,
        }
        return self.mint(claims, audience=audience)

    # -------------------------------------------------------------- HTTP
    def discovery(self) -> dict[str, Any]:
        return {
            "issuer": self.base_url,
            "jwks_uri": self.base_url + JWKS_PATH,
            "token_endpoint": self.base_url + TOKEN_PATH,
            "grant_types_supported": ["client_credentials"],
            "id_token_signing_alg_values_supported": [self._keys[-1].alg],
            "token_endpoint_auth_methods_supported": ["client_secret_post", "client_secret_basic"],
        }

    def app(self) -> FastAPI:
        app = FastAPI(title="oidc-double")

        @app.get(DISCOVERY_PATH)
        async def discovery() -> dict[str, Any]:
            return self.discovery()

        @app.get(JWKS_PATH)
        async def certs() -> dict[str, Any]:
            self.jwks_requests += 1
            return self.jwks()

        @app.post(TOKEN_PATH)
        async def token(request: Request) -> JSONResponse:
            self.token_requests += 1
            form = {k: v[0] for k, v in parse_qs((await request.body()).decode()).items()}
            client_id, secret = form.get("client_id"), form.get("client_secret")
            basic = request.headers.get("authorization", "")
            if basic.lower().startswith("basic "):
                raw = base64.b64decode(basic[6:]).decode()
                client_id, _, secret = raw.partition(":")
            if form.get("grant_type") != "client_credentials":
                return JSONResponse({"error": "unsupported_grant_type"}, status_code=400)
            if not client_id or self.clients.get(client_id) != secret:
                return JSONResponse({"error": "invalid_client"}, status_code=401)
            scope = form.get("scope", "")
            access = self.service_token(client_id, audience=form.get("audience"), scope=scope)
            return JSONResponse(
                {
                    "access_token": access,
                    "token_type": "Bearer",
                    "expires_in": self.token_lifetime,
                    "scope": scope,
                }
            )

        return app


def start_oidc_issuer(
    *,
    key_type: KeyType = "EC",
    clients: dict[str, str] | None = None,
    default_audience: str | None = None,
    tls: tuple[str, str] | None = None,
) -> tuple[OidcIssuer, RunningServer]:
    """Start an issuer as a real HTTP server on loopback; its base URL is its issuer id. `tls`
    (certificate chain, key) serves it over HTTPS."""
    port = free_port()
    issuer = OidcIssuer(
        f"{'https' if tls else 'http'}://127.0.0.1:{port}",
        key_type=key_type,
        clients=dict(clients or {}),
        default_audience=default_audience,
    )
    return issuer, serve_in_thread(issuer.app(), port=port, tls=tls)
