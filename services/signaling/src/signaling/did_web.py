"""Resolve a renewal client's key from its `did:web` document (`/.well-known/did.json`, or
`/<path>/did.json` for a DID with path segments).

Only HTTPS on the default port unless the test setting `DPS_DID_WEB_ALLOW_HTTP` allows plain HTTP
and a port (the local doubles). No redirects are followed, the document is bounded in size, and its
`id` must be the DID itself: a document served for another DID proves nothing."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import ec

MAX_DOCUMENT_BYTES = 64 * 1024


class DidUnresolvable(Exception):
    """The DID is not a did:web this resolver may fetch, or its document cannot be read."""


class KeyNotFound(Exception):
    """The document has no usable EC P-256 key under that id."""


def document_url(did: str, allow_http: bool) -> str:
    parts = did.split(":")
    if len(parts) < 3 or parts[0] != "did" or parts[1] != "web" or not all(parts[2:]):
        raise DidUnresolvable("not a did:web")
    host = unquote(parts[2])
    if "/" in host or "@" in host or "?" in host or "#" in host:
        raise DidUnresolvable("not a host name")
    if ":" in host and not allow_http:
        raise DidUnresolvable("a port is only allowed with DPS_DID_WEB_ALLOW_HTTP")
    path = "/".join(unquote(p) for p in parts[3:])
    scheme = "http" if allow_http else "https"
    return f"{scheme}://{host}/{path + '/did.json' if path else '.well-known/did.json'}"


def _method_key(method: dict[str, Any]) -> ec.EllipticCurvePublicKey:
    jwk = method.get("publicKeyJwk")
    if not isinstance(jwk, dict) or jwk.get("kty") != "EC" or jwk.get("crv") != "P-256" or "d" in jwk:
        raise KeyNotFound("not a public EC P-256 JWK")
    try:
        key = jwt.PyJWK.from_dict(jwk, algorithm="ES256").key
    except (jwt.PyJWKError, ValueError, TypeError):
        raise KeyNotFound("unreadable JWK") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise KeyNotFound("not an EC public key")
    return key


class DidWebResolver:
    def __init__(self, http: httpx.AsyncClient, *, allow_http: bool, timeout_s: float) -> None:
        self._http = http
        self._allow_http = allow_http
        self._timeout = timeout_s

    async def document(self, did: str) -> dict[str, Any]:
        url = document_url(did, self._allow_http)
        try:
            async with self._http.stream("GET", url, timeout=self._timeout, follow_redirects=False) as r:
                if r.status_code != 200:
                    raise DidUnresolvable(f"the DID document answered {r.status_code}")
                body = b""
                async for chunk in r.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_DOCUMENT_BYTES:
                        raise DidUnresolvable("the DID document is too large")
        except httpx.HTTPError as exc:
            raise DidUnresolvable(type(exc).__name__) from None
        try:
            doc = json.loads(body)
        except ValueError:
            raise DidUnresolvable("the DID document is not JSON") from None
        if not isinstance(doc, dict) or doc.get("id") != did:
            raise DidUnresolvable("the document is not this DID's")
        return doc

    async def key(self, kid: str) -> ec.EllipticCurvePublicKey:
        """The key `kid` = `<did>#<key-id>` names in its DID's document (its verification
        method's id written in full or relative to the document, `#<key-id>`)."""
        did, sep, fragment = kid.partition("#")
        if not sep or not fragment:
            raise KeyNotFound("kid is not <did>#<key-id>")
        doc = await self.document(did)
        methods = doc.get("verificationMethod")
        for method in methods if isinstance(methods, list) else []:
            if isinstance(method, dict) and method.get("id") in (kid, f"#{fragment}"):
                if method.get("controller", did) != did:
                    raise KeyNotFound("the key is controlled by another DID")
                return _method_key(method)
        raise KeyNotFound("no such verification method")
