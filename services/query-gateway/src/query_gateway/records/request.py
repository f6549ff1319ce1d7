"""A records request's query string read by the rules of docs/records.md, "The request": the
exact form `filter[field][op]=value`, each pair at most once, `limit` and `cursor` at most once,
and nothing else. Every refusal here is 400 invalid_request — said before anything about the
grant or the dataset is consulted."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl

from dataplane_service_kit.errors import ServiceError

DEFAULT_LIMIT = 100
MAX_LIMIT = 1_000
# a long poll's longest wait (more is read as this): within the chart's default grace period
# (30 s, less its 5 s drain), since the server lets running requests finish before it stops
MAX_WAIT_S = 20
# `filter[<field>][<op>]`: neither part empty, no bracket inside either
_EXACT = re.compile(r"filter\[([^\[\]]+)\]\[([^\[\]]+)\]")
_LIMIT = re.compile(r"[0-9]{1,9}")


class RequestRefused(ServiceError):
    """`invalid_request` answered with the range-filter profile's status, 400 (the gateway's
    other routes answer a malformed body 422)."""

    def __init__(self, detail: str) -> None:
        super().__init__("invalid_request", detail)
        self.status_code = 400


@dataclass(frozen=True)
class RecordsQuery:
    filters: tuple[tuple[str, str, str], ...]  # (field, op, value) as sent, in order
    limit: int
    cursor: str | None
    # a change session: "beginning" or a `next_changes_since` token (docs/records.md)
    changes_since: str | None = None
    wait: int = 0  # seconds a change session may wait for a change (the long poll); 0: none


def _pairs(query_string: bytes) -> list[tuple[str, str]]:
    try:
        text = query_string.decode("ascii")
        return parse_qsl(text, keep_blank_values=True, strict_parsing=bool(text), errors="strict")
    except (UnicodeDecodeError, ValueError):
        raise RequestRefused("the query string is not well formed") from None


def has_filter(query_string: bytes) -> bool:
    """Whether any parameter of the query string is a client filter (any form). The common
    case, no query string or one that cannot spell `filter` even percent-encoded, parses nothing."""
    if b"filter" not in query_string and b"%" not in query_string:
        return False
    try:
        pairs = parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)
    except ValueError:
        return False
    return any(name.startswith("filter") for name, _ in pairs)


def parse_records_query(query_string: bytes) -> RecordsQuery:
    filters: list[tuple[str, str, str]] = []
    seen: set[tuple[str, str]] = set()
    limit: int | None = None
    cursor: str | None = None
    changes_since: str | None = None
    wait: int | None = None
    for name, value in _pairs(query_string):
        if name.startswith("filter"):
            match = _EXACT.fullmatch(name)
            if match is None:
                raise RequestRefused("a client filter must have the form filter[field][op]=value")
            pair = (match.group(1), match.group(2))
            if pair in seen:
                raise RequestRefused("a client filter's field and operator appear more than once")
            seen.add(pair)
            filters.append((pair[0], pair[1], value))
        elif name == "limit":
            if limit is not None or not _LIMIT.fullmatch(value) or int(value) < 1:
                raise RequestRefused("limit must appear once, as a positive integer")
            limit = min(int(value), MAX_LIMIT)
        elif name == "cursor":
            if cursor is not None or not value:
                raise RequestRefused("cursor must appear once, as it was returned")
            cursor = value
        elif name == "changes_since":
            if changes_since is not None or not value:
                raise RequestRefused("changes_since must appear once, as `beginning` or as it was returned")
            changes_since = value
        elif name == "wait":
            if wait is not None or not _LIMIT.fullmatch(value):
                raise RequestRefused("wait must appear once, as a number of seconds")
            wait = min(int(value), MAX_WAIT_S)
        else:
            raise RequestRefused(
                "the records route takes filter[field][op], limit, cursor, changes_since and wait only"
            )
    if cursor is not None and changes_since is not None:
        raise RequestRefused("a page cursor and changes_since do not combine: a session pages by its token")
    if wait is not None and changes_since is None:
        raise RequestRefused("wait is a change session's: it needs changes_since")
    return RecordsQuery(tuple(filters), limit or DEFAULT_LIMIT, cursor, changes_since, wait or 0)


def refuse_any_parameter(query_string: bytes) -> None:
    """The routes other than records take no query parameter: a client filter there (or any
    other parameter) is 400 invalid_request."""
    if query_string:
        raise RequestRefused("this route takes no query parameters")
