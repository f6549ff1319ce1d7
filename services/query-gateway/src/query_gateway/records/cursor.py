"""Records cursors (docs/records.md, "Cursors"): opaque to the client, signed with
RECORDS_CURSOR_SECRET, holding the record key of the page's last row as text, and bound to the
flow, the dataset and the request's filter set — compared as an unordered set of decoded
(field, op, value) triples. Anything else presented is 400 invalid_cursor."""

from __future__ import annotations

import binascii
import functools
import hashlib
import hmac
import json

from dataplane_service_kit.errors import ServiceError
from query_gateway.records.changes_token import SessionCodec, b64, unb64
from query_gateway.records.values import Bound

_VERSION = 1


def filter_set_digest(bounds: tuple[Bound, ...]) -> str:
    """The filter set as one digest: sorted decoded triples, so the parameters' order and the
    spelling of a value (`1.0` or `1`, `Z` or `+00:00`) do not change it."""
    triples = sorted((b.field, b.op, b.canonical) for b in bounds)
    return hashlib.sha256(json.dumps(triples, separators=(",", ":")).encode()).hexdigest()


def _invalid() -> ServiceError:
    return ServiceError("invalid_cursor", "the cursor is not one this request can continue")


class CursorCodec:
    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    @functools.cached_property
    def sessions(self) -> SessionCodec:
        """The `changes_since` tokens' codec, under the same secret."""
        return SessionCodec(self._secret)

    def _mac(self, payload: str) -> str:
        return b64(hmac.new(self._secret, payload.encode("ascii"), hashlib.sha256).digest())

    def encode(self, flow_id: str, dataset_id: str, digest: str, key: list[str]) -> str:
        body = {"v": _VERSION, "f": flow_id, "d": dataset_id, "s": digest, "k": key}
        payload = b64(json.dumps(body, separators=(",", ":")).encode())
        return f"{payload}.{self._mac(payload)}"

    def decode(self, cursor: str, flow_id: str, dataset_id: str, digest: str, key_len: int) -> list[str]:
        """The record key after which the next page starts; invalid_cursor for a cursor not
        signed here, or issued for another flow, dataset or filter set."""
        payload, dot, mac = cursor.partition(".")
        if not dot or not payload.isascii() or not mac.isascii():
            raise _invalid()
        if not hmac.compare_digest(self._mac(payload), mac):
            raise _invalid()
        try:
            body = json.loads(unb64(payload))
        except (ValueError, binascii.Error):
            raise _invalid() from None
        key = body.get("k") if isinstance(body, dict) else None
        if (
            not isinstance(key, list)
            or body.get("v") != _VERSION
            or body.get("f") != flow_id
            or body.get("d") != dataset_id
            or body.get("s") != digest
            or len(key) != key_len
            or not all(isinstance(k, str) for k in key)
        ):
            raise _invalid()
        return key
