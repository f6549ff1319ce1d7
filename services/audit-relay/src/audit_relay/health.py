"""Readiness: the broker and ds, each allowed to be unreachable for a grace period; a credential
refused by ds (401/403) or by the issuer makes the relay unready at once."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping


class Health:
    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.broker_ok_at = time.monotonic()  # the grace also covers start-up
        self.consuming = False
        self._ds_failing_since: dict[str, float] = {}
        self._auth_refused: set[str] = set()
        self.credentials_failing = False

    # -- broker ---------------------------------------------------------------------------------
    def broker_ok(self) -> None:
        self.broker_ok_at = time.monotonic()

    # -- ds, per connector ------------------------------------------------------------------------
    def ds_answered(self, connector: str, accepted: bool) -> None:
        """ds answered (2xx, or a 4xx no retry changes): it is reachable."""
        self._ds_failing_since.pop(connector, None)
        if accepted:
            self._auth_refused.discard(connector)

    def ds_failing(self, connector: str) -> None:
        """Unreachable, timed out, or answering 408/429/5xx."""
        self._ds_failing_since.setdefault(connector, time.monotonic())

    def ds_auth_refused(self, connector: str) -> None:
        self._auth_refused.add(connector)
        self._ds_failing_since.pop(connector, None)

    def forget(self, connector: str) -> None:
        """This replica holds no more work for the connector (its partitions moved to another
        replica): nothing here will ever ask that connector again, so its last failure must not
        keep the replica unready. The new owner reports it if it still fails."""
        self._ds_failing_since.pop(connector, None)
        self._auth_refused.discard(connector)

    # -- checks ---------------------------------------------------------------------------------
    def broker_ready(self) -> bool:
        return self.consuming and time.monotonic() - self.broker_ok_at <= self.grace_s

    def ds_ready(self) -> bool:
        now = time.monotonic()
        return all(now - since <= self.grace_s for since in self._ds_failing_since.values())

    def ds_auth_ready(self) -> bool:
        return not self._auth_refused and not self.credentials_failing

    def checks(self) -> Mapping[str, Callable[[], Awaitable[bool]]]:
        async def broker() -> bool:
            return self.broker_ready()

        async def ds() -> bool:
            return self.ds_ready()

        async def ds_auth() -> bool:
            return self.ds_auth_ready()

        return {"broker": broker, "ds": ds, "ds_auth": ds_auth}
