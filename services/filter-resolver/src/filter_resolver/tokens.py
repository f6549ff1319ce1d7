"""This service's own identity for the REC registry's delegated lookup (RF-05), never the
caller's token: the shared client-credentials token, with its failures sorted into transient
(retried) and final (`row_filter_unavailable`)."""

from __future__ import annotations

import httpx

from dataplane_service_kit.oauth import ClientCredentialsToken, TokenUnavailable
from filter_resolver.errors import TransientUpstream, unavailable


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
        self._token = ClientCredentialsToken(
            http,
            token_url=token_url,
            client_id=client_id,
            client_secret=client_secret,
            scope=scope or None,
            timeout_s=timeout_s,
        )
        self._has_secret = bool(client_secret)

    @property
    def configured(self) -> bool:
        return self._token.configured and self._has_secret

    def invalidate(self) -> None:
        """Drop the cached token (the upstream refused it)."""
        self._token.invalidate()

    async def token(self) -> str:
        if not self.configured:
            raise unavailable("client credentials are not configured (CELINE_OIDC_*)")
        try:
            token = await self._token.get()
        except TokenUnavailable as exc:
            if exc.transient:
                raise TransientUpstream(str(exc)) from None
            raise unavailable(str(exc)) from None
        if token is None:
            raise unavailable("client credentials are not configured (CELINE_OIDC_*)")
        return token
