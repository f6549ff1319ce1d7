"""This service's own bearer: an OAuth2 client-credentials token from the OIDC issuer, fetched
once, refreshed before it expires, dropped when an upstream refuses it. Each service decides what
a failure means for its callers; this module only reports it."""

from __future__ import annotations

import asyncio
import time

import httpx

from dataplane_service_kit.logs import get_logger

log = get_logger(__name__)


class TokenUnavailable(Exception):
    """The issuer could not be asked, refused, or answered something unreadable.

    `status` is the issuer's HTTP status, or None when it could not be reached."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def transient(self) -> bool:
        return self.status is None or self.status >= 500


class ClientCredentialsToken:
    def __init__(
        self,
        http: httpx.AsyncClient,
        *,
        token_url: str | None,
        client_id: str | None,
        client_secret: str | None,
        scope: str | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        self._http = http
        self._token_url = token_url
        self._client_id = client_id
        self._client_secret = client_secret
        self._scope = scope
        self._timeout_s = timeout_s
        self._token: str | None = None
        self._refresh_at = 0.0
        # one fetch at a time: concurrent callers share the answer instead of stampeding the issuer
        self._lock = asyncio.Lock()
        if not self.configured:
            log.warning("service_token_not_configured", hint="CELINE_OIDC_CLIENT_ID/SECRET/BASE_URL unset")

    @property
    def configured(self) -> bool:
        return bool(self._token_url and self._client_id)

    async def get(self) -> str | None:
        """The current token; None when no client is configured (the upstream will refuse)."""
        if not self.configured:
            return None
        async with self._lock:
            if self._token is None or time.monotonic() >= self._refresh_at:
                await self._fetch()
            return self._token

    def invalidate(self, token: str | None = None) -> None:
        """An upstream refused `token` (or the current one): fetch anew next time, unless another
        task already replaced it."""
        if token is None or token == self._token:
            self._token = None

    async def _fetch(self) -> None:
        assert self._token_url is not None  # configured
        form = {
            "grant_type": "client_credentials",
            "client_id": self._client_id or "",
            "client_secret": self._client_secret or "",
        }
        if self._scope:
            form["scope"] = self._scope
        try:
            response = await self._http.post(self._token_url, data=form, timeout=self._timeout_s)
        except httpx.HTTPError as exc:
            raise TokenUnavailable(f"token endpoint unreachable: {type(exc).__name__}") from None
        if response.status_code != 200:
            raise TokenUnavailable(f"token endpoint answered {response.status_code}", response.status_code)
        try:
            body = response.json()
            token = body["access_token"]
            expires_in = float(body.get("expires_in", 60))
        except (ValueError, KeyError, TypeError):
            raise TokenUnavailable("token endpoint sent an unreadable answer", 200) from None
        if not isinstance(token, str) or not token:
            raise TokenUnavailable("token endpoint sent no access_token", 200)
        # refresh ahead of expiry: a third of the lifetime, at most a minute, so a token is never
        # used in its last seconds (clock skew, whole-second `exp` claims, the request's duration)
        margin = min(60.0, expires_in / 3)
        self._token = token
        self._refresh_at = time.monotonic() + max(0.0, expires_in - margin)
        log.info("service_token_fetched", expires_in=expires_in)
