"""The `Authorization` request header, read one way by every service: `Bearer <token>`, the scheme
in any case, white space around the token ignored."""

from __future__ import annotations


def bearer(header: str | None, *, scheme_optional: bool = False) -> str | None:
    """The token of a `Bearer` header; None when the header is absent, names another scheme or
    carries no token. `scheme_optional`: a header without the `Bearer` scheme is the token itself
    (a DPS pull token may be sent either way)."""
    if not header:
        return None
    value = header.strip()
    scheme, _, token = value.partition(" ")
    if scheme.lower() == "bearer":
        return token.strip() or None
    return (value or None) if scheme_optional else None
