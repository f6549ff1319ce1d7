"""DEVELOPMENT DOUBLE of the ds connector (the provider's EDC-style connector), never deployed.

It plays one connector at the root (`/internal/...`) and/or several under a path prefix each
(`/{participant}/internal/...`), each with its own EC P-256 key:

- `GET  /internal/edr-jwks`             → `{"keys": [EC public JWK]}`
- `POST /internal/dataplane/authorize`  → a decision computed from the policy (below)
- `POST /internal/audit/query`          → records body and headers, answers `200 {}` (a plain
                                           ASGI door, `DsConnectorApp`: the relay's bench rate)
- `GET  /_calls`, `POST /_control`, `GET /_participants` → test controls (see `control`)

Policy (YAML or dict; `deploy/local/ds-policy.yaml` is an example)::

    participant_id: did:web:provider.example     # root connector; omit the root keys for none
    private_key_pem: "..."                        # optional; else a fresh key per start
    agreements:
      agr-demo:
        consumer: did:web:consumer.example
        cache: {ttl_seconds: 60}                  # optional, envelope default
        partial_allow: false                      # optional; true: a per-dataset deny leaves the
                                                  # envelope `allow` (see below)
        datasets:                                 # a list (str or {dataset_id, ...}) or a mapping
          - dataset_id: meter_readings
            decision: allow                       # allow (default) | deny
            reason: null                          # for a deny
            row_filter: {handler: ..., args: {}}  # raw, passed through verbatim (any JSON)
            consent: meter-consent                # optional: keys/subject_dids/principals added
            organizations: [...]                  # optional, verbatim
            cache: {ttl_seconds: 30}              # optional; the envelope takes the smallest
            decision_ref: <64 hex> | null         # optional; default sha256 of the request; null omits
    consents:
      meter-consent:
        - {subject_did: did:web:alice.example, keys: ["pod:A"], principals: [alice], withdrawn: false}
    participants:                                 # more connectors, served under /{name}/
      provider-b: {participant_id: ..., agreements: ..., consents: ...}
    service_auth:                                 # optional check of the caller's service bearer
      require: true | jwks_url: URL | token: STATIC   (+ optional audience, required_scope)

Deny when the agreement is unknown (`agreement_unknown`), the consumer is not the agreement's
(`consumer_mismatch`), or a requested dataset is not in the agreement (`dataset_not_in_agreement`).
By default any per-dataset deny also denies the envelope. With `partial_allow: true` on the
agreement, the envelope stays `allow` while a dataset's own verdict is `deny` — the answer of a
connector that decides dataset by dataset, which a data plane must still refuse per dataset."""

from __future__ import annotations

import copy
import hashlib
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from dataplane_local.doubles._common import (
    Call,
    DoubleBase,
    JwksVerifier,
    add_common_routes,
    apply_fault,
    bearer_in,
    common_control,
    json_or_text,
    run_main,
)

ROOT = ""
AUDIT_PATH = "/internal/audit/query"
# verified service bearers kept (token → claims) before the cache starts again from empty
_VERIFIED_MAX = 1024
_ROOT_KEYS = {"participant_id", "private_key_pem", "agreements", "consents"}
_TOP_KEYS = _ROOT_KEYS | {"participants", "service_auth"}


@dataclass
class Participant:
    name: str  # path prefix; "" is the root connector
    participant_id: str
    key: ec.EllipticCurvePrivateKey
    kid: str
    agreements: dict[str, Any]
    consents: dict[str, Any]

    def public_jwk(self) -> dict[str, Any]:
        jwk: dict[str, Any] = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(self.key.public_key()))
        jwk.update({"kid": self.kid, "alg": "ES256", "use": "sig"})
        return jwk

    def private_key_pem(self) -> str:
        return self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()


def _load_key(pem: str | None) -> ec.EllipticCurvePrivateKey:
    if pem is None:
        return ec.generate_private_key(ec.SECP256R1())
    key = serialization.load_pem_private_key(pem.encode(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError("private_key_pem must be an EC private key")
    return key


class DsConnectorDouble(DoubleBase):
    """State of the ds connector double; `create_app(state)` serves it over HTTP."""

    def __init__(
        self, policy: dict[str, Any] | None = None, service_auth: dict[str, Any] | None = None
    ) -> None:
        super().__init__()
        self.participants: dict[str, Participant] = {}
        self.service_auth: dict[str, Any] = {}
        self._verifier: JwksVerifier | None = None
        self._verified: dict[str, dict[str, Any]] = {}
        self.set_policy(policy or {"participant_id": "did:web:provider.example", "agreements": {}})
        if service_auth is not None:
            self.set_service_auth(service_auth)

    # -- configuration ------------------------------------------------------------------------
    def set_policy(self, policy: dict[str, Any]) -> None:
        """Replace the policy. A participant that keeps its name keeps its key (unless the new
        policy names one), so tokens minted before stay valid."""
        unknown = set(policy) - _TOP_KEYS
        if unknown:
            raise ValueError(f"unknown policy keys: {sorted(unknown)}")
        specs: dict[str, dict[str, Any]] = dict(policy.get("participants") or {})
        if any(k in policy for k in _ROOT_KEYS) or not specs:
            specs[ROOT] = {k: policy[k] for k in _ROOT_KEYS if k in policy}
        built: dict[str, Participant] = {}
        with self._lock:
            for name, spec in specs.items():
                extra = set(spec) - _ROOT_KEYS
                if extra:
                    raise ValueError(f"participant {name!r}: unknown keys {sorted(extra)}")
                old = self.participants.get(name)
                pem = spec.get("private_key_pem")
                key = old.key if old is not None and pem is None else _load_key(pem)
                built[name] = Participant(
                    name=name,
                    participant_id=spec.get("participant_id")
                    or (old.participant_id if old else f"did:web:{name or 'provider'}.example"),
                    key=key,
                    kid=old.kid if old is not None and pem is None else uuid.uuid4().hex[:16],
                    agreements=copy.deepcopy(spec.get("agreements") or {}),
                    consents=copy.deepcopy(spec.get("consents") or {}),
                )
            self.participants = built
        if "service_auth" in policy:
            self.set_service_auth(policy["service_auth"] or {})

    def set_service_auth(self, service_auth: dict[str, Any]) -> None:
        """`{}` = no check; `{"require": true}` = a bearer must be present; `{"token": T}` = exactly
        T; `{"jwks_url": U, "audience": A?, "required_scope": S?}` = a JWT verified against U."""
        self.service_auth = dict(service_auth)
        url = self.service_auth.get("jwks_url")
        self._verifier = JwksVerifier(url, self.service_auth.get("audience")) if url else None
        self._verified = {}

    def set_consent(
        self, consent: str, subject_did: str, *, withdrawn: bool, participant: str = ROOT
    ) -> None:
        """Withdraw (or grant again) one subject's consent at runtime: the next decision that reads
        the consent sees it. The rest of the policy, and the signing key, stay as they are."""
        with self._lock:
            grants = self.participant(participant).consents.get(consent)
            found = [g for g in grants or [] if g.get("subject_did") == subject_did]
            if not found:
                raise ValueError(f"no consent {consent!r} of {subject_did!r}")
            for grant in found:
                grant["withdrawn"] = withdrawn

    def participant(self, name: str = ROOT) -> Participant:
        with self._lock:
            if name not in self.participants:
                raise KeyError(f"no participant {name!r}")
            return self.participants[name]

    # -- EDR tokens ---------------------------------------------------------------------------
    def mint_edr(
        self,
        consumer: str,
        agreement: str | None = None,
        *,
        participant: str = ROOT,
        jti: str | None = None,
        iat: int | None = None,
        claims: dict[str, Any] | None = None,
    ) -> str:
        """An EDC-shaped EDR token: jti, aud=consumer, iss=sub=provider, iat, no exp; ES256."""
        p = self.participant(participant)
        payload: dict[str, Any] = {
            "jti": jti or str(uuid.uuid4()),
            "aud": consumer,
            "iss": p.participant_id,
            "sub": p.participant_id,
            "iat": iat if iat is not None else int(time.time()),
        }
        if agreement is not None:
            payload["agreement_id"] = agreement
        payload.update(claims or {})
        return jwt.encode(payload, p.key, algorithm="ES256", headers={"kid": p.kid})

    def jwks(self, participant: str = ROOT) -> dict[str, Any]:
        return {"keys": [self.participant(participant).public_jwk()]}

    # -- decisions ----------------------------------------------------------------------------
    def decide(self, participant: str, request: dict[str, Any]) -> dict[str, Any]:
        p = self.participant(participant)
        consumer = request.get("consumer_did")
        agreement_id = request.get("agreement_id")
        dataset_ids = [str(d) for d in request.get("dataset_ids") or []]
        envelope: dict[str, Any] = {
            "decision": "deny",
            "reason": None,
            "detail": None,
            "agreement_id": agreement_id,
            "transfer_id": request.get("transfer_id"),
            "purpose": request.get("purpose") or [],
            "datasets": [],
            "cache": None,
            "decision_ref": None,
        }
        agreement = p.agreements.get(agreement_id) if isinstance(agreement_id, str) else None
        if agreement is None or agreement.get("consumer") != consumer:
            reason = "agreement_unknown" if agreement is None else "consumer_mismatch"
            envelope["reason"] = reason
            envelope["datasets"] = [
                {"dataset_id": d, "decision": "deny", "reason": reason} for d in dataset_ids
            ]
            return envelope
        configured = _dataset_entries(agreement.get("datasets"))
        ttls: list[int] = []
        refs: list[str | None] = []
        explicit_ref = False
        if isinstance((agreement.get("cache") or {}).get("ttl_seconds"), int):
            ttls.append(agreement["cache"]["ttl_seconds"])
        for dataset_id in dataset_ids:
            entry = configured.get(dataset_id)
            if entry is None:
                envelope["datasets"].append(
                    {"dataset_id": dataset_id, "decision": "deny", "reason": "dataset_not_in_agreement"}
                )
                continue
            verdict: dict[str, Any] = {"dataset_id": dataset_id, "decision": entry.get("decision", "allow")}
            if entry.get("reason") is not None:
                verdict["reason"] = entry["reason"]
            if "row_filter" in entry:
                verdict["row_filter"] = self._with_consents(p, copy.deepcopy(entry["row_filter"]), entry)
            if "organizations" in entry:
                verdict["organizations"] = copy.deepcopy(entry["organizations"])
            if isinstance((entry.get("cache") or {}).get("ttl_seconds"), int):
                ttls.append(entry["cache"]["ttl_seconds"])
            if "decision_ref" in entry:
                explicit_ref = True
                refs.append(entry["decision_ref"])
            envelope["datasets"].append(verdict)
        denied = [v for v in envelope["datasets"] if v["decision"] != "allow"]
        if not dataset_ids:
            envelope["reason"] = "no_datasets"
            return envelope
        if denied and agreement.get("partial_allow") is not True:
            envelope["reason"] = denied[0].get("reason", "denied")
            return envelope
        envelope["decision"] = "allow"
        envelope["cache"] = {"ttl_seconds": min(ttls)} if ttls else None
        if explicit_ref:
            envelope["decision_ref"] = next((r for r in refs if r is not None), None)
        else:
            digest = json.dumps([p.participant_id, agreement_id, consumer, sorted(dataset_ids)])
            envelope["decision_ref"] = hashlib.sha256(digest.encode()).hexdigest()
        if envelope["decision_ref"] is None:
            del envelope["decision_ref"]  # the newer field absent, as an older connector sends it
        return envelope

    @staticmethod
    def _with_consents(p: Participant, row_filter: Any, entry: dict[str, Any]) -> Any:
        name = entry.get("consent")
        if name is None or not isinstance(row_filter, dict):
            return row_filter
        grants = [g for g in p.consents.get(name) or [] if not g.get("withdrawn")]
        keys = set(row_filter.get("keys") or []) | {k for g in grants for k in g.get("keys") or []}
        dids = set(row_filter.get("subject_dids") or []) | {
            g["subject_did"] for g in grants if "subject_did" in g
        }
        principals = {x for g in grants for x in g.get("principals") or []}
        row_filter["keys"] = sorted(keys)
        row_filter["subject_dids"] = sorted(dids)
        if principals or "principals" in row_filter:
            row_filter["principals"] = sorted(set(row_filter.get("principals") or []) | principals)
        return row_filter

    # -- HTTP controls ------------------------------------------------------------------------
    def control(self, body: dict[str, Any]) -> Any:
        handled, result = common_control(self, body)
        if handled:
            return result
        action = body["action"]
        if action == "policy":
            self.set_policy(body["policy"])
            return None
        if action == "service_auth":
            self.set_service_auth(body.get("service_auth") or {})
            return None
        if action == "consent":
            self.set_consent(
                body["consent"],
                body["subject_did"],
                withdrawn=bool(body["withdrawn"]),
                participant=body.get("participant", ROOT),
            )
            return None
        if action == "reset":
            self.clear_faults()
            self.clear_calls()
            return None
        if action == "mint_edr":
            token = self.mint_edr(
                body["consumer"],
                body.get("agreement"),
                participant=body.get("participant", ROOT),
                jti=body.get("jti"),
                iat=body.get("iat"),
                claims=body.get("claims"),
            )
            return {"token": token}
        raise ValueError(f"unknown action {action!r}")

    def check_service_bearer(self, authorization: str) -> Response | None:
        """None when the `Authorization` header value passes the configured check, else the refusal."""
        cfg = self.service_auth
        if not cfg:
            return None
        token = bearer_in(authorization)
        if token is None:
            return JSONResponse({"detail": "service bearer required"}, status_code=401)
        if "token" in cfg and token != cfg["token"]:
            return JSONResponse({"detail": "service bearer not accepted"}, status_code=401)
        if self._verifier is not None:
            claims = self._verified_claims(self._verifier, token)
            if claims is None:
                return JSONResponse({"detail": "service bearer not valid"}, status_code=401)
            scope = cfg.get("required_scope")
            if scope and scope not in str(claims.get("scope", "")).split():
                return JSONResponse({"detail": "scope missing"}, status_code=403)
        return None

    def _verified_claims(self, verifier: JwksVerifier, token: str) -> dict[str, Any] | None:
        """The token's claims once its signature verified, None if it does not. A caller sends the
        same bearer until it expires (the audit relay, one post per event): its signature is
        checked once and its claims kept until their `exp`, as a real connector may cache them."""
        verified = self._verified
        claims = verified.get(token)
        if claims is not None:
            exp = claims.get("exp")
            if not isinstance(exp, int | float) or exp > time.time():
                return claims
        try:
            claims = verifier.verify(token)
        except Exception:
            verified.pop(token, None)
            return None
        if len(verified) >= _VERIFIED_MAX:
            verified.clear()
        verified[token] = claims
        return claims


def _dataset_entries(datasets: Any) -> dict[str, dict[str, Any]]:
    if isinstance(datasets, dict):
        return {str(k): dict(v or {}) for k, v in datasets.items()}
    entries: dict[str, dict[str, Any]] = {}
    for item in datasets or []:
        if isinstance(item, str):
            entries[item] = {}
        else:
            entries[str(item["dataset_id"])] = dict(item)
    return entries


class DsConnectorApp(FastAPI):
    """The double's FastAPI app behind a plain-ASGI door for `POST [/{participant}]/internal/audit/
    query`: the audit relay posts one event per request, thousands a second in the benches, and
    the framework's routing, middleware and request objects cost several times what answering and
    recording the call does. The door answers exactly as the route would (same checks, faults and
    recorded call); every other request goes to FastAPI."""

    double: DsConnectorDouble

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            participant = _audit_participant(scope["path"])
            if participant is not None:
                await self._audit(scope, receive, send, participant)
                return
        await super().__call__(scope, receive, send)

    async def _audit(self, scope: Scope, receive: Receive, send: Send, participant: str) -> None:
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the caller left: nothing was answered, nothing is recorded
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        # the names lower-case and the last of a repeated header, as the FastAPI route records them
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        body = json_or_text(b"".join(chunks))
        response = await _answer(self.double, participant, "audit", headers, body)
        if response is None:
            await send(_ACCEPTED_START)
            await send(_ACCEPTED_BODY)
            status = 200
        else:
            await response(scope, receive, send)
            status = response.status_code
        self.double.record(Call("audit", participant, "POST", scope["path"], headers, body, status))


# `200 {}`, ds's answer to an audit post, as JSONResponse({}) renders it
_ACCEPTED_START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-length", b"2"), (b"content-type", b"application/json")],
}
_ACCEPTED_BODY = {"type": "http.response.body", "body": b"{}"}


def _audit_participant(path: str) -> str | None:
    """The connector an audit path addresses (ROOT for `/internal/audit/query`), None for any
    other path: the same shapes the FastAPI routes match, a participant being one path segment."""
    if path == AUDIT_PATH:
        return ROOT
    if not path.endswith(AUDIT_PATH):
        return None
    name = path[1 : -len(AUDIT_PATH)]
    if not path.startswith("/") or not name or "/" in name:
        return None
    return name


async def _answer(
    state: DsConnectorDouble, participant: str, endpoint: str, headers: dict[str, str], body: Any
) -> Response | None:
    """The answer to one call of an endpoint; None for an accepted audit post (`200 {}`)."""
    if participant not in state.participants:
        return JSONResponse({"detail": f"no connector {participant!r} here"}, status_code=404)
    faulted = await apply_fault(state.take_fault(endpoint, participant))
    if faulted is not None:
        return faulted
    refused = state.check_service_bearer(headers.get("authorization", ""))
    if refused is not None:
        return refused
    if endpoint == "jwks":
        return JSONResponse(state.jwks(participant))
    if endpoint == "audit":
        return None
    if not isinstance(body, dict) or not isinstance(body.get("dataset_ids"), list):
        return JSONResponse({"detail": "authorize body must carry dataset_ids"}, status_code=422)
    return JSONResponse(state.decide(participant, body))


def create_app(state: DsConnectorDouble) -> FastAPI:
    app = DsConnectorApp(title="ds connector DEVELOPMENT DOUBLE")
    app.double = state
    app.state.double = state

    async def handle(request: Request, participant: str, endpoint: str) -> Response:
        body = json_or_text(await request.body()) if request.method == "POST" else None
        headers = {k.lower(): v for k, v in request.headers.items()}
        response = await _answer(state, participant, endpoint, headers, body)
        if response is None:
            response = JSONResponse({})
        answer = json_or_text(bytes(response.body)) if endpoint == "authorize" else None
        state.record(
            Call(
                endpoint,
                participant,
                request.method,
                request.url.path,
                headers,
                body,
                response.status_code,
                answer=answer,
            )
        )
        return response

    for prefix, fixed in (("", ROOT), ("/{participant}", None)):

        def bind(endpoint: str, fixed: str | None = fixed) -> Any:
            async def route(request: Request) -> Response:
                name = fixed if fixed is not None else request.path_params["participant"]
                return await handle(request, name, endpoint)

            return route

        app.add_api_route(f"{prefix}/internal/edr-jwks", bind("jwks"), methods=["GET"])
        app.add_api_route(f"{prefix}/internal/dataplane/authorize", bind("authorize"), methods=["POST"])
        # answered by the door (DsConnectorApp); the route stays for the framework's view of the app
        app.add_api_route(f"{prefix}{AUDIT_PATH}", bind("audit"), methods=["POST"])

    @app.get("/_participants")
    def participants() -> dict[str, Any]:
        return {
            name: {"participant_id": p.participant_id, "path": f"/{name}" if name else ""}
            for name, p in state.participants.items()
        }

    add_common_routes(app, state, state.control)
    return app


def build(config: dict[str, Any]) -> FastAPI:
    return create_app(DsConnectorDouble(config))


def main(argv: list[str] | None = None) -> None:
    run_main("ds_connector", build, argv)


if __name__ == "__main__":
    main()
