"""This service's own identity for the REC registry's delegated lookup (RF-05), never the
caller's token: the shared client-credentials token (`dataplane_service_kit.oauth`), with its
failures sorted into transient (retried) and final (`row_filter_unavailable`). Unlike the other
services the resolver has no use for a missing bearer: without complete credentials every
delegated lookup is final."""

from __future__ import annotations

from dataplane_service_kit.oauth import ClientCredentialsToken, TokenUnavailable
from filter_resolver.errors import TransientUpstream, unavailable

NOT_CONFIGURED = "client credentials are not configured (CELINE_OIDC_*)"


class ClientCredentials:
    def __init__(self, token: ClientCredentialsToken) -> None:
        self._token = token

    @property
    def configured(self) -> bool:
        return self._token.complete

    def invalidate(self) -> None:
        """Drop the cached token (the upstream refused it)."""
        self._token.invalidate()

    async def token(self) -> str:
        if not self.configured:
            raise unavailable(NOT_CONFIGURED)
        try:
            token = await self._token.get()
        except TokenUnavailable as exc:
            if exc.transient:
                raise TransientUpstream(str(exc)) from None
            raise unavailable(str(exc)) from None
        if token is None:
            raise unavailable(NOT_CONFIGURED)
        return token
