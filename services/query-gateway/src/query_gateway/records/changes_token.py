"""`next_changes_since` tokens (docs/records.md, "Change sessions"): opaque and sealed with a key
derived from RECORDS_CURSOR_SECRET (AES-256-GCM: authenticated like the page cursor's HMAC, and
encrypted, so the record key of a position is not readable in the token). A token binds the
flow, the dataset, the filter set, the projection, the position in change order (its horizon)
and a keyed digest of the visibility context it was issued under (ds's verdict and the resolved
row filters, as the narrowed statement binds them) — a digest, never the keys themselves.

A token not sealed here, for another flow or dataset, or presented with another filter set is
400 invalid_cursor; a page cursor is not a token, nor a token a cursor."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from dataplane_service_kit.errors import ServiceError
from query_gateway.sql import Position

BEGINNING = "beginning"
_VERSION = "changes-1"  # never the page cursor's version: neither is read as the other
_NONCE = 12


def invalid_token() -> ServiceError:
    return ServiceError("invalid_cursor", "the changes_since token is not one this request can continue")


@dataclass(frozen=True)
class Session:
    """What a token says, once opened."""

    projection: str  # digest of the exposed columns and their masks
    context: str  # keyed digest of the visibility context
    position: Position


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _canonical(value: object) -> str:
    """A bound value as stable text: its type and repr (a list of keys as a sorted set, the
    order a resolver answered in being no change of context)."""
    if isinstance(value, list | tuple):
        return "[" + ",".join(sorted(_canonical(v) for v in value)) + "]"
    return f"{type(value).__name__}:{value!r}"


class SessionCodec:
    def __init__(self, secret: bytes) -> None:
        self._seal = AESGCM(hmac.new(secret, b"records changes_since token", hashlib.sha256).digest())
        self._digest_key = hmac.new(secret, b"records visibility context", hashlib.sha256).digest()

    def digest(self, *parts: object) -> str:
        """A keyed digest of a visibility context or projection: equal contexts, equal digests;
        nothing of the values can be read back or guessed without the secret."""
        text = json.dumps([_canonical(p) for p in parts], separators=(",", ":"))
        return b64(hmac.new(self._digest_key, text.encode(), hashlib.sha256).digest())

    def encode(self, flow_id: str, dataset_id: str, filters: str, session: Session) -> str:
        p = session.position
        body = {
            "v": _VERSION,
            "f": flow_id,
            "d": dataset_id,
            "s": filters,
            "p": session.projection,
            "c": session.context,
            "x": p.change,
            "k": list(p.key) if p.key is not None else None,
            "t": p.floor,
        }
        nonce = os.urandom(_NONCE)
        sealed = self._seal.encrypt(nonce, json.dumps(body, separators=(",", ":")).encode(), None)
        return b64(nonce + sealed)

    def decode(self, token: str, flow_id: str, dataset_id: str, filters: str, key_len: int) -> Session:
        if not token.isascii():
            raise invalid_token()
        try:
            raw = unb64(token)
            body = json.loads(self._seal.decrypt(raw[:_NONCE], raw[_NONCE:], None))
        except (ValueError, binascii.Error, InvalidTag):
            raise invalid_token() from None
        if not isinstance(body, dict) or body.get("v") != _VERSION:
            raise invalid_token()
        if (body.get("f"), body.get("d"), body.get("s")) != (flow_id, dataset_id, filters):
            raise invalid_token()
        change, key, floor = body.get("x"), body.get("k"), body.get("t")
        projection, context = body.get("p"), body.get("c")
        if not isinstance(change, str) or not change.isdigit():
            raise invalid_token()
        if floor is not None and not (isinstance(floor, str) and floor.isdigit()):
            raise invalid_token()
        if not (isinstance(projection, str) and isinstance(context, str)):
            raise invalid_token()
        if key is not None and not _texts(key, key_len):
            raise invalid_token()
        position = Position(change, tuple(key) if key is not None else None, floor)
        return Session(projection, context, position)


def _texts(key: object, key_len: int) -> bool:
    return isinstance(key, list) and len(key) == key_len and all(isinstance(k, str) for k in key)
