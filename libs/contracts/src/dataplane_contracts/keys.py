"""Typed data keys, `"<type>:<value>"` (RF-03).

The type is a lowercase token; the value is everything after the FIRST colon, so a value may
itself contain colons. A malformed key is skipped: one unreadable entry narrows the answer by one
subject instead of failing the request for everyone who consented, and it can never widen it."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple

# Always `fullmatch`: with `match`, `$` also matches before a trailing line break, so
# "pod:pod-1\n" would read as pod-1.
KEY_RE = re.compile(r"^(?P<type>[a-z][a-z0-9_-]{0,31}):(?P<value>\S{1,256})$")


class TypedKey(NamedTuple):
    type: str
    value: str


def split_key(raw: object) -> TypedKey | None:
    """Split one key at its first colon; None when it does not follow the grammar."""
    if not isinstance(raw, str):
        return None
    match = KEY_RE.fullmatch(raw)
    if match is None:
        return None
    return TypedKey(match.group("type"), match.group("value"))


def values_of_type(keys: Iterable[object], key_type: str) -> list[str]:
    """The values of one type, sorted and de-duplicated so one allow-list renders one way."""
    return sorted({k.value for k in (split_key(raw) for raw in keys) if k is not None and k.type == key_type})
