"""This service's own bearer: an OAuth2 client-credentials token from the OIDC issuer, fetched
once, refreshed before it expires, dropped when an upstream refuses it.

Every service takes it from `service_token` (CELINE_OIDC_BASE_URL, CELINE_OIDC_CLIENT_ID,
CELINE_OIDC_CLIENT_SECRET; docs/configuration.md), and `signaling register` asks the same way
once (`fetch_token`). Each service decides what a failure means for its callers — the gateway's
`502 ds_unavailable`, the resolver's `row_filter_unavailable` or a retry, the relay's retry and
`ds_auth` unreadiness, a DPS callback retried later — this module only reports it, fail closed:

- no client id (or no issuer): not configured, no bearer (`get()` is None), a warning at start;
- a client id without its secret: every `get()` raises, final, and the issuer is not asked (a
  client-credentials grant needs the secret; sending an empty one only earns the issuer's 401);
- the issuer unreachable, refusing or unreadable: `TokenUnavailable`, transient unless the
  issuer answered 4xx.

Neither the token nor the secret is ever logged or put in an exception's text."""

from __future__ import annotations

import asyncio
import time

import httpx

from dataplane_contracts.settings import OidcSettings
from dataplane_service_kit.logs import get_logger

log = get_logger(__name__)


class TokenUnavailable(Exception):
    """The issuer could not be asked, refused, or answered something unreadable; or the
    credentials are incomplete (`final`).

    `status` is the issuer's HTTP status, or None when it was not reached."""

    def __init__(self, message: str, status: int | None = None, *, final: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.final = final

    @property
    def transient(self) -> bool:
        return not self.final and (self.status is None or self.status >= 500)


# the answer's lifetime when the issuer gives none (RFC 6749 section 5.1 makes it optional)
DEFAULT_EXPIRES_IN_S = 60.0
SECRET_MISSING = "client credentials are incomplete: CELINE_OIDC_CLIENT_SECRET is not set"


def _grant(client_id: str, client_secret: str, scope: str | None) -> dict[str, str]:
    """RFC 6749 section 4.4.2, the client authenticated in the body (client_secret_post)."""
    form = {"grant_type": "client_credentials", "client_id": client_id, "client_secret": client_secret}
    if scope:
        form["scope"] = scope
    return form


def _read_answer(response: httpx.Response) -> tuple[str, float]:
    """(access token, lifetime in seconds) of the issuer's answer, else TokenUnavailable. The
    answer's body is never quoted: an issuer may echo the request, secret included."""
    if response.status_code != 200:
        raise TokenUnavailable(f"token endpoint answered {response.status_code}", response.status_code)
    try:
        body = response.json()
        token = body["access_token"]
        expires_in = float(body.get("expires_in", DEFAULT_EXPIRES_IN_S))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise TokenUnavailable("token endpoint sent an unreadable answer", 200) from None
    if not isinstance(token, str) or not token:
        raise TokenUnavailable("token endpoint sent no access_token", 200)
    return token, expires_in


def _unreachable(exc: httpx.HTTPError) -> TokenUnavailable:
    return TokenUnavailable(f"token endpoint unreachable: {type(exc).__name__}")


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
        elif not self.complete:
            log.warning("service_token_incomplete", hint="CELINE_OIDC_CLIENT_SECRET unset")

    def __repr__(self) -> str:  # the token and the secret stay out of logs and tracebacks
        return f"ClientCredentialsToken(configured={self.configured}, complete={self.complete})"

    @property
    def configured(self) -> bool:
        """A client id and an issuer: this service is meant to send a bearer."""
        return bool(self._token_url and self._client_id)

    @property
    def complete(self) -> bool:
        """Configured, and with the secret the grant needs."""
        return self.configured and bool(self._client_secret)

    async def get(self) -> str | None:
        """The current token; None when no client is configured (the upstream will refuse)."""
        if not self.configured:
            return None
        if not self.complete:
            raise TokenUnavailable(SECRET_MISSING, final=True)
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
        assert self._token_url is not None and self._client_id and self._client_secret  # complete
        form = _grant(self._client_id, self._client_secret, self._scope)
        try:
            response = await self._http.post(self._token_url, data=form, timeout=self._timeout_s)
        except httpx.HTTPError as exc:
            raise _unreachable(exc) from None
        token, expires_in = _read_answer(response)
        # refresh ahead of expiry: a third of the lifetime, at most a minute, so a token is never
        # used in its last seconds (clock skew, whole-second `exp` claims, the request's duration)
        margin = min(60.0, expires_in / 3)
        self._token = token
        self._refresh_at = time.monotonic() + max(0.0, expires_in - margin)
        log.info("service_token_fetched", expires_in=expires_in)


def service_token(
    http: httpx.AsyncClient, settings: OidcSettings, *, timeout_s: float, scope: str | None = None
) -> ClientCredentialsToken:
    """The service's token source from the shared OIDC settings; `timeout_s` bounds one fetch
    (each service passes the bound of the calls the token is for)."""
    secret = settings.celine_oidc_client_secret
    return ClientCredentialsToken(
        http,
        token_url=settings.oidc_token_url(),
        client_id=settings.celine_oidc_client_id,
        client_secret=secret.get_secret_value() if secret is not None else None,
        scope=scope or None,
        timeout_s=timeout_s,
    )


def fetch_token(http: httpx.Client, token_url: str, client_id: str, client_secret: str) -> str:
    """One token, asked synchronously (a command that runs once, not a service): the same grant
    and the same reading of the answer as `ClientCredentialsToken`, nothing kept."""
    if not client_secret:
        raise TokenUnavailable(SECRET_MISSING, final=True)
    try:
        response = http.post(token_url, data=_grant(client_id, client_secret, None))
    except httpx.HTTPError as exc:
        raise _unreachable(exc) from None
    return _read_answer(response)[0]
