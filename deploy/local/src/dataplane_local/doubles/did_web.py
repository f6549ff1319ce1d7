"""A did:web host double: serves the DID documents of consumers that renew http-pull tokens, and
signs their client JWTs with the keys it publishes.

    host, server = start_did_web_host()
    consumer = host.identity("consumer")      # did:web:127.0.0.1%3A<port>:consumer
    jwt = consumer.client_jwt(aud=provider_did, token=access_token)

The DIDs carry a port and are served over plain HTTP, so the resolver must allow that
(`DPS_DID_WEB_ALLOW_HTTP`, a test setting). A DID never made with `identity` answers 404."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from dataplane_local.doubles.server import RunningServer, serve_in_thread


@dataclass
class DidIdentity:
    did: str
    key_id: str
    key: ec.EllipticCurvePrivateKey

    @property
    def kid(self) -> str:
        return f"{self.did}#{self.key_id}"

    def client_jwt(
        self,
        aud: str,
        token: str,
        *,
        key: ec.EllipticCurvePrivateKey | None = None,
        kid: str | None = None,
        lifetime_s: int = 600,
        **claims: Any,
    ) -> str:
        """A renewal client JWT as the token-renewal profile describes it; `claims` override or
        (with None) remove a claim, `key`/`kid` sign it otherwise (forgeries)."""
        now = int(time.time())
        body: dict[str, Any] = {
            "iss": self.did,
            "sub": self.did,
            "aud": aud,
            "jti": str(uuid.uuid4()),
            "iat": now,
            "exp": now + lifetime_s,
            "token": token,
        }
        body.update(claims)
        body = {k: v for k, v in body.items() if v is not None}
        return jwt.encode(body, key or self.key, algorithm="ES256", headers={"kid": kid or self.kid})

    def document(self) -> dict[str, Any]:
        jwk = jwt.algorithms.ECAlgorithm.to_jwk(self.key.public_key(), as_dict=True)
        return {
            "@context": ["https://www.w3.org/ns/did/v1"],
            "id": self.did,
            "verificationMethod": [
                {"id": self.kid, "type": "JsonWebKey2020", "controller": self.did, "publicKeyJwk": jwk}
            ],
            "authentication": [self.kid],
        }


@dataclass
class DidWebHost:
    host: str = ""  # `127.0.0.1%3A<port>`, set once the server listens
    _identities: dict[str, DidIdentity] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    requests: list[str] = field(default_factory=list)

    def identity(self, name: str = "", key_id: str = "key-1") -> DidIdentity:
        """A DID on this host (`name` empty: the host's own, at /.well-known/did.json)."""
        did = f"did:web:{self.host}" + (f":{name}" if name else "")
        ident = DidIdentity(did, key_id, ec.generate_private_key(ec.SECP256R1()))
        with self._lock:
            self._identities[name] = ident
        return ident

    def app(self) -> FastAPI:
        app = FastAPI(title="did-web-double")

        @app.get("/{path:path}")
        async def document(path: str) -> JSONResponse:
            with self._lock:
                self.requests.append("/" + path)
                name = "" if path == ".well-known/did.json" else path.removesuffix("/did.json")
                ident = self._identities.get(name) if path.endswith("did.json") else None
            if ident is None:
                return JSONResponse({"error": "not_found"}, status_code=404)
            return JSONResponse(ident.document())

        return app


def start_did_web_host() -> tuple[DidWebHost, RunningServer]:
    double = DidWebHost()
    server = serve_in_thread(double.app())
    double.host = f"127.0.0.1%3A{server.port}"
    return double, server
