"""This service's own bearer for ds (reference §1.4): OIDC client credentials, fetched once,
refreshed before it expires, fetched again after ds answers 401."""

from __future__ import annotations

import asyncio
import time

import httpx

from dataplane_service_kit.logs import get_logger

log = get_logger(__name__)


class TokenUnavailable(Exception):
    """The issuer could not be asked or refused; delivery retries later."""


class ServiceToken:
    def __init__(
        self,
        client: httpx.AsyncClient,
        token_url: str | None,
        client_id: str | None,
        client_secret: str | None,
    ) -> None:
        self._client = client
        self._token_url = token_url
        self._client_id = client_id
        self._client_secret = client_secret
        self._token: str | None = None
        self._refresh_at = 0.0
        # one fetch at a time: several partitions may need a token at the same moment
        self._lock = asyncio.Lock()
        if not client_id:
            log.warning("service_token_not_configured", hint="CELINE_OIDC_CLIENT_ID is unset; ds will refuse")

    @property
    def configured(self) -> bool:
        return bool(self._client_id)

    async def get(self) -> str | None:
        """The current token (None when no client is configured)."""
        if not self.configured:
            return None
        async with self._lock:
            if self._token is None or time.monotonic() >= self._refresh_at:
                await self._fetch()
            return self._token

    def invalidate(self, token: str | None) -> None:
        """ds refused `token`: forget it, unless another task already replaced it."""
        if token is not None and token == self._token:
            self._token = None

    async def _fetch(self) -> None:
        assert self._token_url is not None  # settings require the issuer with a client id
        data = {
            "grant_type": "client_credentials",
            "client_id": self._client_id or "",
            "client_secret": self._client_secret or "",
        }
        try:
            response = await self._client.post(self._token_url, data=data)
        except httpx.HTTPError as exc:
            raise TokenUnavailable(f"token endpoint unreachable: {type(exc).__name__}") from None
        if response.status_code != 200:
            raise TokenUnavailable(f"token endpoint answered {response.status_code}")
        try:
            body = response.json()
            token = body["access_token"]
            expires_in = float(body.get("expires_in", 60))
        except (ValueError, KeyError, TypeError):
            raise TokenUnavailable("token endpoint sent an unreadable answer") from None
        if not isinstance(token, str) or not token:
            raise TokenUnavailable("token endpoint sent no access_token")
        # refresh ahead of expiry: a third of the lifetime, at most a minute, so a token is never
        # used in its last seconds (clock skew, whole-second `exp` claims, the request's duration)
        margin = min(60.0, expires_in / 3)
        self._token = token
        self._refresh_at = time.monotonic() + max(0.0, expires_in - margin)
        log.info("service_token_fetched", expires_in=expires_in)
