"""`http_in_list`: the caller's own rows are named by an HTTP endpoint's list (reference §3.3).

args: `column`, `url`; `method` (GET|POST), `headers`, `params`, `json`, `response_path` (`$`),
`timeout_seconds` (5), `max_items` (2000), `empty_means_deny` (true), `forward_token` (false).
Every string in url, headers, params and json may name `{sub}`, `{username}`, `{email}` and
`{token}`. A delegated request is refused: the endpoint answers for the caller, not for the
subjects a dataspace decision names."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import httpx

from dataplane_contracts.plans import CallerIdentity, ClaimCheck, Plan
from dataplane_service_kit.logs import get_logger
from filter_resolver.errors import TransientUpstream, invalid, unavailable
from filter_resolver.handlers.base import person_caller, refuse_delegation, required_str, unique_in_order

NAME = "http_in_list"
PLACEHOLDER = re.compile(r"\{(sub|username|email|token)\}")

log = get_logger(__name__)


class HttpInListHandler:
    name = NAME

    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http

    async def resolve(self, claim: ClaimCheck) -> Plan:
        refuse_delegation(NAME, claim)
        args = claim.args
        column = required_str(NAME, args, "column")
        request = _Request.from_args(args, person_caller(NAME, claim))
        try:
            response = await self._http.request(
                request.method,
                request.url,
                headers=request.headers,
                params=request.params,
                json=request.body if request.method == "POST" else None,
                timeout=request.timeout,
            )
        except (httpx.InvalidURL, httpx.UnsupportedProtocol):
            raise invalid(f"{NAME}: argument 'url' is not a usable URL") from None
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
    def __init__(self, args: Mapping[str, Any], caller: CallerIdentity) -> None:
        self.fill = _Filler(caller)
        method = args.get("method", "GET")
        if not isinstance(method, str) or method.upper() not in ("GET", "POST"):
            raise invalid(f"{NAME}: argument 'method' must be GET or POST")
        self.method = method.upper()
        self.url = self.fill(required_str(NAME, args, "url"))
        self.headers = {str(k): self.fill(v) for k, v in _mapping(args, "headers").items()}
        self.params = {str(k): self.fill(v) for k, v in _mapping(args, "params").items()}
        self.body = self.fill(args.get("json"))
        path = args.get("response_path", "$")
        if not isinstance(path, str):
            raise invalid(f"{NAME}: argument 'response_path' must be a string")
        self.response_path = path
        self.timeout = _number(args, "timeout_seconds", 5.0)
        self.max_items = int(_number(args, "max_items", 2000))
        if self.max_items < 1 or self.timeout <= 0:
            raise invalid(f"{NAME}: 'max_items' and 'timeout_seconds' must be positive")
        self.empty_means_deny = _flag(args, "empty_means_deny", True)
        if _flag(args, "forward_token", False):
            if not caller.token:
                raise invalid(f"{NAME}: forward_token is set but the request carries no token")
            self.headers["authorization"] = f"Bearer {caller.token}"

    @classmethod
    def from_args(cls, args: Mapping[str, Any], caller: CallerIdentity) -> _Request:
        return cls(args, caller)


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


def _mapping(args: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = args.get(name) or {}
    if not isinstance(value, dict) or not all(isinstance(v, str | int | float) for v in value.values()):
        raise invalid(f"{NAME}: argument '{name}' must be a mapping of scalars")
    return value


def _number(args: Mapping[str, Any], name: str, default: float) -> float:
    value = args.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid(f"{NAME}: argument '{name}' must be a number")
    return float(value)


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
