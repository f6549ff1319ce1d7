"""DPS-09: the pull token, verified with signaling's public key and looked up in the pull-grant
view on every request (never cached: a retired token is refused from the moment it retired). Only
the token's signature check is memoised (query_gateway.clients.verified); the grant never is.

Two kinds of token: DPS-06's (no `exp`, the flow's facts held only against the `jti`) and the
http-pull profile's access token (an `exp`, checked here, and claims naming the flow, which must
agree with the grant). An access token issued by a renewal is *pending* until first used: its
first pull on a replica calls `dps_pull_token_used` (signaling's function, the read role's only
write), which retires the pair it replaces."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import asyncpg
import jwt
from pydantic import ValidationError

from dataplane_contracts.dps import (
    PULL_GRANT_COLUMNS,
    PULL_GRANT_VIEW,
    PULL_TOKEN_ALGORITHM,
    PULL_TOKEN_USED_FUNCTION,
    AccessTokenClaims,
    FlowState,
    PullTokenClaims,
)
from dataplane_service_kit.authorization import bearer
from dataplane_service_kit.bounded_cache import BoundedCache
from dataplane_service_kit.errors import ServiceError
from dataplane_service_kit.logs import get_logger
from query_gateway.clients.verified import VerifiedTokens, exp_of, memoisable
from query_gateway.sql import rolled_back_only


@dataclass(frozen=True)
class PullGrant:
    flow_id: str
    state: str
    agreement_id: str
    dataset_id: str
    participant_id: str
    counter_party_id: str
    grant_extensions: str | None = None  # JSON text: the frozen range filters (docs/records.md)


@dataclass(frozen=True)
class VerifiedPull:
    consumer: str  # the token's aud
    provider: str  # the flow's participant
    agreement_id: str  # the flow's agreement
    flow_id: str
    dataset_id: str = ""  # the flow's dataset
    grant_extensions: str | None = None  # as the grant holds them, checked by their reader


log = get_logger(__name__)

# the whole grant read (a pooled connection, the read, its return) when the caller names no bound
DEFAULT_GRANT_TIMEOUT_S = 2.0

# a constant view name; the token id is a bound parameter
_GRANT_SQL = f"SELECT {', '.join(PULL_GRANT_COLUMNS[1:])} FROM {PULL_GRANT_VIEW} WHERE token_id = $1"  # noqa: S608


_USED_SQL = f"SELECT {PULL_TOKEN_USED_FUNCTION}($1)"
# access-token ids this replica already reported used: at most one write per token per replica
USED_MEMO_SIZE = 4096


async def flows_pool(url: str, timeout_s: float) -> asyncpg.Pool:
    """The pull-grant reads' pool: every bound `timeout_s`, read-only sessions, and no reset
    query on release (the read leaves no session state; the default reset is a second round trip
    on every pull)."""
    pool: asyncpg.Pool = await asyncpg.create_pool(
        url,
        min_size=1,
        max_size=5,
        command_timeout=timeout_s,
        timeout=timeout_s,
        server_settings={"default_transaction_read_only": "on"},
        reset=rolled_back_only,
    )
    return pool


class PullVerifier:
    def __init__(
        self, public_key_pem: str, flows_pool: asyncpg.Pool, *, timeout_s: float = DEFAULT_GRANT_TIMEOUT_S
    ) -> None:
        self._key = public_key_pem
        self._pool = flows_pool
        self._timeout = timeout_s
        # the signature check and claim parsing of a token seen before; the key is fixed for the
        # process. Only the signature is memoised: the grant is read on every request (below)
        self._verified: VerifiedTokens[PullTokenClaims | AccessTokenClaims] = VerifiedTokens()
        self._used: BoundedCache[str, bool] = BoundedCache(USED_MEMO_SIZE)  # oldest first out

    def claims(self, token: str | None) -> PullTokenClaims | AccessTokenClaims:
        """The token's claims once its signature verified; an access token past its `exp` is
        `pull_token_expired` (the memo never serves an entry at or after its `exp`, so an expired
        token always reaches the check below)."""
        if token is None:
            raise ServiceError("pull_token", "a pull needs the token from the data address")
        memo = self._verified.get(token)
        if memo is not None:
            return memo.value
        try:
            raw = jwt.decode(
                token,
                self._key,
                algorithms=[PULL_TOKEN_ALGORITHM],
                options={"verify_aud": False, "verify_exp": False, "require": ["jti", "iss", "sub", "aud"]},
            )
            claims: PullTokenClaims | AccessTokenClaims = (
                AccessTokenClaims.model_validate(raw) if "exp" in raw else PullTokenClaims.model_validate(raw)
            )
        except (jwt.PyJWTError, ValidationError, ValueError):
            raise ServiceError("pull_token", "pull token is not valid") from None
        if isinstance(claims, AccessTokenClaims) and claims.exp <= time.time():
            raise ServiceError("pull_token_expired", "the access token has expired: renew it")
        if memoisable(raw):
            self._verified.put(token, claims, self._key, exp_of(raw))
        return claims

    async def grant(self, jti: str) -> PullGrant | None:
        """The token's grant, or None. Any failure to read it (the flows database down, stopped
        or killing connections, a timeout, an SQL error of the view) is 503 database_unavailable:
        without the grant nothing is served, and the pull may be retried."""
        try:
            async with (
                asyncio.timeout(self._timeout),
                self._pool.acquire(timeout=self._timeout) as conn,
            ):
                row = await conn.fetchrow(_GRANT_SQL, jti, timeout=self._timeout)
        except Exception as exc:  # asyncpg's InternalClientError among them: never a bare 500
            log.warning("pull_grant_unreadable", error=type(exc).__name__)
            raise ServiceError("database_unavailable", "the pull grants cannot be read now") from None
        if row is None:
            return None
        extensions = row["grant_extensions"]
        return PullGrant(
            **{k: str(row[k]) for k in PULL_GRANT_COLUMNS[1:-1]},
            grant_extensions=None if extensions is None else str(extensions),
        )

    async def first_use(self, jti: str) -> None:
        """Report an http-pull access token used (once per replica): a renewal's pending pair
        becomes current, and the old access and refresh tokens are dead for every reader from the
        commit on. The pool's sessions are read-only by default, so this one transaction says
        READ WRITE; the read role may execute the function and nothing else."""
        if jti in self._used:
            return
        try:
            async with (
                asyncio.timeout(self._timeout),
                self._pool.acquire(timeout=self._timeout) as conn,
                conn.transaction(),
            ):
                await conn.execute("SET TRANSACTION READ WRITE", timeout=self._timeout)
                await conn.execute(_USED_SQL, jti, timeout=self._timeout)
        except Exception as exc:
            log.warning("pull_token_use_unrecorded", error=type(exc).__name__)
            raise ServiceError("database_unavailable", "the pull grants cannot be updated now") from None
        self._used.put(jti, True)

    async def verify(
        self,
        header: str | None,
        agreement_header: str | None,
        identified: Callable[[str, str], None] | None = None,
    ) -> VerifiedPull:
        """DPS-09 refusals, in order: 401 pull_token (no/invalid/not live token), 403
        flow_not_started, 401 pull_token (aud/iss ≠ flow), 403 agreement_mismatch.

        `identified(consumer, agreement_id)` is called as soon as the token is known to be its
        flow's live one, before the flow's state and the agreement header are judged: those
        refusals are then recorded against the consumer and the flow's agreement (GS-02)."""
        claims = self.claims(bearer(header, scheme_optional=True))  # with or without `Bearer`
        grant = await self.grant(claims.jti)
        if grant is None:
            raise ServiceError("pull_token", "pull token is not live")
        consumer, matches = _holder(claims, grant)
        if matches and identified is not None:
            identified(consumer, grant.agreement_id)
        if grant.state != FlowState.STARTED.value:
            raise ServiceError("flow_not_started", f"data flow is {grant.state}")
        if not matches:
            raise ServiceError("pull_token", "pull token does not match its data flow")
        if agreement_header and agreement_header != grant.agreement_id:
            raise ServiceError("agreement_mismatch", "the agreement header does not match the data flow")
        if isinstance(claims, AccessTokenClaims):
            await self.first_use(claims.jti)
        return VerifiedPull(
            consumer=consumer,
            provider=grant.participant_id,
            agreement_id=grant.agreement_id,
            flow_id=grant.flow_id,
            dataset_id=grant.dataset_id,
            grant_extensions=grant.grant_extensions,
        )


def _holder(claims: PullTokenClaims | AccessTokenClaims, grant: PullGrant) -> tuple[str, bool]:
    """The consumer the token names, and whether everything it claims agrees with its grant."""
    if isinstance(claims, AccessTokenClaims):
        agrees = (
            claims.sub == grant.counter_party_id
            and claims.iss == grant.participant_id
            and claims.aud == grant.participant_id
            and claims.data_flow_id == grant.flow_id
            and claims.dataset_id == grant.dataset_id
            and claims.agreement_id == grant.agreement_id
        )
        return claims.sub, agrees
    return claims.aud, claims.aud == grant.counter_party_id and claims.iss == grant.participant_id
