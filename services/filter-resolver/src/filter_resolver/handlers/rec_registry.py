"""`rec_registry`: a member's rows are the rows of the meters they own in the REC registry.

The order decides (spec, "`rec_registry` on the normal API path"):
1. principals present, even empty — a delegated request: `[]` is a deny without a call; else the
   named members' metered assets through the registry's lookup, on this service's own identity;
2. a service account — no predicate;
3. a person — their own assets with their own token, through celine-sdk's public
   `RecRegistryUserClient.get_my_assets`; no metered asset → deny (RF-11); the registry's own
   `not_a_member` answer → deny (RF-12); anything else that is not a readable 200 → error."""

from __future__ import annotations

import json
import ssl
from typing import Any

import httpx
from celine.sdk.rec_registry import RecRegistryApiError, RecRegistryUserClient

from dataplane_contracts.plans import ClaimCheck, Plan
from dataplane_service_kit.logs import get_logger
from filter_resolver.errors import TransientUpstream, invalid, unavailable
from filter_resolver.handlers.base import optional_str, person_caller, required_str, unique_in_order
from filter_resolver.tokens import ClientCredentials

NAME = "rec_registry"
NOT_A_MEMBER_CODE = "not_a_member"
NOT_A_MEMBER_DETAIL = "You are not a member of any community"
LOOKUP_PATH = "/admin/lookup/assets-by-user-ids"
MAX_LOOKUP_IDS = 500  # the registry refuses larger batches (docs/wire-contracts.md)

log = get_logger(__name__)


def is_not_a_member(exc: BaseException) -> bool:
    """RF-12: only the registry's own answer to a caller who is no member.

    Status 403, then the code, then — only when the body names no code at all — the exact
    detail. The SDK reads a code only when it is a string; a code of any other type still
    counts as a code, so it is looked for in the raw body and never falls through to the
    detail match. Anything that is not a RecRegistryApiError is not the answer."""
    if not isinstance(exc, RecRegistryApiError) or exc.status_code != 403:
        return False
    if exc.code is not None:
        return bool(exc.code == NOT_A_MEMBER_CODE)
    body = _json_object(exc.body)
    if body is None:  # a proxy's page, an empty body: not the registry speaking
        return False
    if body.get("code") is not None:
        return False
    return exc.detail == NOT_A_MEMBER_DETAIL and body.get("detail") == NOT_A_MEMBER_DETAIL


def _json_object(raw: object) -> dict[str, Any] | None:
    if not isinstance(raw, bytes | str) or not raw:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


class RecRegistryHandler:
    name = NAME

    def __init__(
        self,
        http: httpx.AsyncClient,
        credentials: ClientCredentials,
        default_url: str | None,
        timeout_s: float,
        tls: ssl.SSLContext,
    ) -> None:
        self._http = http
        self._credentials = credentials
        self._default_url = default_url
        self._timeout_s = timeout_s
        self._user_clients: dict[str, RecRegistryUserClient] = {}
        # The SDK builds a new httpx client for every call, and one built with verify=True loads
        # a CA bundle into a new TLS context each time: about 50 ms of CPU per plan here
        # (issue 12). The service's one outbound context (dataplane_service_kit.outbound_tls,
        # built once) is handed to every call instead: the same checks, once, on the same trust
        # store as every other client. The SDK's clients keep httpx's trust_env, so the proxy
        # variables apply to them too.
        self._tls = tls

    async def resolve(self, claim: ClaimCheck) -> Plan:
        args = claim.args
        column = required_str(NAME, args, "column")
        url = optional_str(NAME, args, "url", self._default_url or "").rstrip("/")
        if claim.principals is not None:
            if not claim.principals:
                return Plan.deny()  # RF-05: a delegation naming nobody narrows to nothing
            return await self._delegated(url, column, list(claim.principals))
        caller = person_caller(NAME, claim)
        if caller.service_account:
            return Plan.allow_all()
        if not caller.token:
            raise invalid(f"{NAME}: a person's request carries no token")
        return await self._own_assets(url, column, caller.token)

    # -- the person's own assets ---------------------------------------------------------------
    async def _own_assets(self, url: str, column: str, token: str) -> Plan:
        client = self._user_client(url)
        try:
            answer = await client.get_my_assets(token=token)
        except RecRegistryApiError as exc:
            if is_not_a_member(exc):
                log.info("rec_registry_not_a_member", status=exc.status_code, code=exc.code)
                return Plan.deny()
            _log_failure("rec_registry_user_assets_failed", exc.status_code, exc.code)
            if exc.status_code is not None and exc.status_code >= 500:
                raise TransientUpstream(f"registry answered {exc.status_code}") from None
            raise unavailable(f"{NAME}: registry answered {exc.status_code}") from None
        sensors = [a.sensor_id for a in answer.items if isinstance(a.sensor_id, str) and a.sensor_id]
        return Plan.among(column, unique_in_order(sensors))  # none → deny (RF-11)

    def _user_client(self, url: str) -> RecRegistryUserClient:
        # one client per registry URL: the SDK takes the token per call
        client = self._user_clients.get(url)
        if client is None:
            client = RecRegistryUserClient(base_url=url, timeout=self._timeout_s, verify_ssl=self._tls)
            self._user_clients[url] = client
        return client

    # -- delegated: the named members' assets --------------------------------------------------
    async def _delegated(self, url: str, column: str, principals: list[str]) -> Plan:
        sensors: list[str] = []
        for start in range(0, len(principals), MAX_LOOKUP_IDS):
            for asset in await self._lookup(url, principals[start : start + MAX_LOOKUP_IDS]):
                sensor, owner = asset.get("sensor_id"), asset.get("owner_user_id")
                if isinstance(sensor, str) and sensor and owner:
                    sensors.append(sensor)
        return Plan.among(column, unique_in_order(sensors))

    async def _lookup(self, url: str, user_ids: list[str]) -> list[dict[str, Any]]:
        token = await self._credentials.token()
        response = await self._http.post(
            url + LOOKUP_PATH,
            json={"user_ids": user_ids},
            headers={"authorization": f"Bearer {token}"},
            timeout=self._timeout_s,
        )
        if response.status_code != 200:
            code = _code_of(response)
            _log_failure("rec_registry_lookup_failed", response.status_code, code)
            if response.status_code == 401:
                self._credentials.invalidate()  # the next attempt fetches a fresh token
            if response.status_code >= 500:
                raise TransientUpstream(f"registry answered {response.status_code}")
            raise unavailable(f"{NAME}: registry lookup answered {response.status_code}")
        try:
            doc = response.json()
        except ValueError:
            doc = None
        if not isinstance(doc, list) or not all(isinstance(a, dict) for a in doc):
            _log_failure("rec_registry_lookup_unreadable", response.status_code, None)
            raise unavailable(f"{NAME}: registry lookup answered 200 with nothing readable")
        return doc


def _code_of(response: httpx.Response) -> str | None:
    body = _json_object(response.content)
    code = body.get("code") if body else None
    return code if isinstance(code, str) else None


def _log_failure(event: str, status: int | None, code: str | None) -> None:
    # status and code only: the registry's sentence may quote the caller
    log.warning(event, status=status, code=code)
