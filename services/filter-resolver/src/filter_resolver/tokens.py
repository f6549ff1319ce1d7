"""This service's own identity: an OAuth2 client-credentials token, cached until shortly before
it expires. Used for the REC registry's delegated lookup (RF-05), never the caller's token."""

from __future__ import annotations

import asyncio
import time

import httpx

from filter_resolver.errors import TransientUpstream, unavailable

_EARLY_REFRESH_S = 30  # refresh before expiry so a token never dies in flight


class ClientCredentials:
    def __init__(
        self,
        http: httpx.AsyncClient,
        *,
        token_url: str | None,
        client_id: str | None,
        client_secret: str | None,
        scope: str,
        timeout_s: float,
    ) -> None:
        self._http = http
        self._token_url = token_url
        self._client_id = client_id
        self._client_secret = client_secret
        self._scope = scope
        self._timeout_s = timeout_s
        self._token: str | None = None
        self._expires_at = 0.0
        self._lock = asyncio.Lock()

    @property
    def configured(self) -> bool:
        return bool(self._token_url and self._client_id and self._client_secret)

    def invalidate(self) -> None:
        """Drop the cached token (the upstream refused it)."""
        self._token = None
        self._expires_at = 0.0

    async def token(self) -> str:
        async with self._lock:
            if self._token is not None and time.monotonic() < self._expires_at:
                return self._token
            self._token, lifetime = await self._fetch()
            self._expires_at = time.monotonic() + max(0, lifetime - _EARLY_REFRESH_S)
            return self._token

    async def _fetch(self) -> tuple[str, int]:
        if not self.configured or self._token_url is None:
            raise unavailable("client credentials are not configured (CELINE_OIDC_*)")
        form = {
            "grant_type": "client_credentials",
            "client_id": self._client_id or "",
            "client_secret": self._client_secret or "",
        }
        if self._scope:
            form["scope"] = self._scope
        response = await self._http.post(self._token_url, data=form, timeout=self._timeout_s)
        if response.status_code >= 500:
            raise TransientUpstream(f"token endpoint answered {response.status_code}")
        if response.status_code != 200:
            raise unavailable(f"token endpoint answered {response.status_code}")
        try:
            body = response.json()
            token = body["access_token"]
            lifetime = int(body.get("expires_in", 60))
        except (ValueError, KeyError, TypeError):
            raise unavailable("token endpoint answered 200 with nothing readable") from None
        if not isinstance(token, str) or not token:
            raise unavailable("token endpoint answered 200 with nothing readable")
        return token, lifetime
