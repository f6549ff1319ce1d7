"""`http_in_list`: the caller's own rows are named by an HTTP endpoint's list (docs/row-filters.md).

args: `column`, `url`; `method` (GET|POST), `headers`, `params`, `json`, `response_path` (`$`),
`timeout_seconds` (5), `max_items` (2000), `empty_means_deny` (true), `forward_token` (false).
Every string in url, headers, params and json may name `{sub}`, `{username}`, `{email}` and
`{token}`. A delegated request is refused: the endpoint answers for the caller, not for the
subjects a dataspace decision names.

An argument that cannot make an HTTP request — a header that is not a string, a parameter that is
not a scalar, a URL that is not http(s) — is a filter that cannot be applied as declared
(`row_filter_invalid`), found before anything is sent. It must never reach the HTTP client and
surface there as a failed call: that would read as an outage (`row_filter_unavailable`) and be
retried, though no attempt can ever succeed."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import httpx

from dataplane_contracts.plans import CallerIdentity, ClaimCheck, Plan
from dataplane_service_kit.logs import get_logger
from filter_resolver.errors import TransientUpstream, invalid, unavailable
from filter_resolver.handlers.base import person_caller, required_str, unique_in_order

NAME = "http_in_list"
PLACEHOLDER = re.compile(r"\{(sub|username|email|token)\}")

log = get_logger(__name__)


class HttpInListHandler:
    name = NAME

    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http

    async def resolve(self, claim: ClaimCheck) -> Plan:
        args = claim.args
        column = required_str(NAME, args, "column")
        request = _Request(args, person_caller(NAME, claim))
        response = await self._http.send(request.build(self._http))
        if response.status_code >= 500:
            log.warning("http_in_list_failed", status=response.status_code)
            raise TransientUpstream(f"endpoint answered {response.status_code}")
        if not 200 <= response.status_code < 300:
            log.warning("http_in_list_failed", status=response.status_code)
            raise unavailable(f"{NAME}: endpoint answered {response.status_code}")
        items = _items(response, request.response_path)
        values = unique_in_order(items)[: request.max_items]
        if not values:
            return Plan.deny() if request.empty_means_deny else Plan.allow_all()
        return Plan.among(column, values)


class _Request:
    """The args, checked and filled: every value has the type the HTTP request needs."""

    def __init__(self, args: Mapping[str, Any], caller: CallerIdentity) -> None:
        self.fill = _Filler(caller)
        method = args.get("method", "GET")
        if not isinstance(method, str) or method.upper() not in ("GET", "POST"):
            raise invalid(f"{NAME}: argument 'method' must be GET or POST")
        self.method = method.upper()
        self.url = self.fill(required_str(NAME, args, "url"))
        self.headers = _headers(args, self.fill)
        self.params = _params(args, self.fill)
        self.body = self.fill(args.get("json"))
        path = args.get("response_path", "$")
        if not isinstance(path, str):
            raise invalid(f"{NAME}: argument 'response_path' must be a string")
        self.response_path = path
        self.timeout = _positive_number(args, "timeout_seconds", 5.0)
        self.max_items = _positive_int(args, "max_items", 2000)
        self.empty_means_deny = _flag(args, "empty_means_deny", True)
        if _flag(args, "forward_token", False):
            if not caller.token:
                raise invalid(f"{NAME}: forward_token is set but the request carries no token")
            # replaces a configured one whatever its case: two would reach the endpoint otherwise
            self.headers = {k: v for k, v in self.headers.items() if k.lower() != "authorization"}
            self.headers["authorization"] = f"Bearer {caller.token}"

    def build(self, http: httpx.AsyncClient) -> httpx.Request:
        """The request, or `row_filter_invalid` when the URL cannot be one. Each check above
        already refused what httpx would reject; the except clause is the last line for a value
        httpx still cannot encode, so it is never mistaken for an unreachable endpoint."""
        try:
            request = http.build_request(
                self.method,
                self.url,
                headers=self.headers,
                params=self.params,
                json=self.body if self.method == "POST" else None,
                timeout=self.timeout,
            )
        except (httpx.InvalidURL, TypeError, ValueError):
            raise invalid(f"{NAME}: the arguments do not make a valid HTTP request") from None
        if request.url.scheme not in ("http", "https") or not request.url.host:
            raise invalid(f"{NAME}: argument 'url' is not a usable http(s) URL")
        return request


class _Filler:
    """Substitutes the four placeholders, recursively; nothing else in a string is touched (a
    JSON template may hold braces of its own). A placeholder the caller has no value for is an
    error rather than an empty string, which could widen what the endpoint answers."""

    def __init__(self, caller: CallerIdentity) -> None:
        self._values = {
            "sub": caller.sub,
            "username": caller.username,
            "email": caller.email,
            "token": caller.token,
        }

    def __call__(self, value: Any) -> Any:
        if isinstance(value, str):
            return PLACEHOLDER.sub(self._one, value)
        if isinstance(value, list):
            return [self(v) for v in value]
        if isinstance(value, dict):
            return {k: self(v) for k, v in value.items()}
        return value

    def _one(self, match: re.Match[str]) -> str:
        value = self._values[match.group(1)]
        if not value:
            raise invalid(f"{NAME}: placeholder '{{{match.group(1)}}}' has no value for this caller")
        return value


# RFC 9110 token characters: anything else in a header name is rejected by the HTTP library
# only when sending, as a protocol error that would be retried like a broken connection
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_SCALAR = str | int | float  # bool is an int: a query parameter may be true/false


def _mapping(args: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = args.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid(f"{NAME}: argument '{name}' must be a mapping")
    return value


def _headers(args: Mapping[str, Any], fill: _Filler) -> dict[str, str]:
    """Header values are strings (a number is not silently turned into one: only string arguments
    are formatted), printable ASCII after the placeholders are filled — a line break would
    inject a header, a non-ASCII value has no encoding httpx will send."""
    out: dict[str, str] = {}
    for key, raw in _mapping(args, "headers").items():
        if not isinstance(key, str) or not _HEADER_NAME.fullmatch(key):
            raise invalid(f"{NAME}: argument 'headers' has a name that is not a valid header name")
        if not isinstance(raw, str):
            raise invalid(f"{NAME}: argument 'headers' must map names to strings")
        value = fill(raw)
        # the value may now hold the caller's identity: the detail never quotes it (RF-08)
        if not (value.isascii() and value.isprintable()):
            raise invalid(f"{NAME}: a header value is not printable ASCII once filled")
        out[key] = value
    return out


def _params(args: Mapping[str, Any], fill: _Filler) -> dict[str, Any]:
    """A query parameter is a scalar or a list of scalars (a repeated parameter); a mapping or a
    null has no single rendering in a query string, so it is refused rather than guessed."""
    out: dict[str, Any] = {}
    for key, raw in _mapping(args, "params").items():
        items = raw if isinstance(raw, list) else [raw]
        if not isinstance(key, str) or not all(isinstance(v, _SCALAR) for v in items):
            raise invalid(f"{NAME}: argument 'params' must map names to scalars or lists of scalars")
        out[key] = fill(raw)
    return out


def _positive_number(args: Mapping[str, Any], name: str, default: float) -> float:
    value = args.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid(f"{NAME}: argument '{name}' must be a number")
    if not (math.isfinite(value) and value > 0):
        raise invalid(f"{NAME}: argument '{name}' must be a positive number")
    return float(value)


def _positive_int(args: Mapping[str, Any], name: str, default: int) -> int:
    # a fraction of an item has no meaning: 2.5 is refused, not rounded
    value = args.get(name, default)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise invalid(f"{NAME}: argument '{name}' must be a positive whole number")
    return value


def _flag(args: Mapping[str, Any], name: str, default: bool) -> bool:
    value = args.get(name, default)
    if not isinstance(value, bool):
        raise invalid(f"{NAME}: argument '{name}' must be true or false")
    return value


def _items(response: httpx.Response, path: str) -> list[str | int | float | bool]:
    """The list at `response_path` (a dot path; `$` or `$.a.b` or `a.b`); a scalar is one item;
    nulls are dropped. Anything else is an unreadable answer — an error, never an empty list."""
    try:
        node: Any = response.json()
    except ValueError:
        raise unavailable(f"{NAME}: endpoint answered with no JSON") from None
    parts = [p for p in path.removeprefix("$").split(".") if p]
    for part in parts:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise unavailable(f"{NAME}: the answer has nothing at 'response_path'")
    found = node if isinstance(node, list) else [node]
    items = [v for v in found if v is not None]
    if not all(isinstance(v, str | int | float | bool) for v in items):
        raise unavailable(f"{NAME}: the list at 'response_path' holds non-scalar items")
    return items
