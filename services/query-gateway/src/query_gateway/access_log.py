"""Access records (GS-01, GS-02): one per dataset read or refused, on logger `dataplane.audit`,
one JSON object per line, with reason code, request id and trace id — never a name or email.
The line's one timestamp is the logging setup's `timestamp` (dataplane_service_kit.logs)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from dataplane_service_kit.logs import AUDIT_LOGGER, get_logger

QUERY_ACTION = "dataset.query"
# GS-02: a bearer that does not verify is refused as a token check, not as a dataset read — no
# caller is known yet, and no dataset has been judged
TOKEN_ACTION = "auth.token"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

log = get_logger(AUDIT_LOGGER)


def _clean(value: str | None) -> str | None:
    return None if value is None else _CONTROL.sub("", value)[:256]


@dataclass
class AccessContext:
    """What every record of one request shares."""

    request_id: str
    trace_id: str | None
    method: str
    route: str
    sub: str | None = None
    client_id: str | None = None
    service_account: bool = False
    agreement_id: str | None = None
    decision_ref: str | None = None
    touched: list[str] = field(default_factory=list)  # datasets the statement resolved to
    current: str | None = None  # the dataset being judged when a refusal is raised
    action: str = QUERY_ACTION

    # What the request learns as it goes, said here once: the pipeline tells the record, it
    # never sets the record's fields itself.
    def as_consumer(self, consumer: str, agreement_id: str) -> None:
        """A dataspace request: the verified consumer (DID) and its agreement."""
        self.sub = self.client_id = consumer
        self.agreement_id = agreement_id

    def as_caller(self, sub: str | None, client_id: str | None, service_account: bool) -> None:
        """A normal-path request: the verified bearer's subject and client."""
        self.sub, self.client_id, self.service_account = sub, client_id, service_account

    def touching(self, dataset_ids: list[str]) -> None:
        """The datasets the records name: the statement's, or only the offending ones."""
        self.touched = dataset_ids

    def judging(self, dataset_id: str | None) -> None:
        """The dataset a refusal raised from now on is about (None: the whole statement)."""
        self.current = dataset_id

    def decided(self, decision_ref: str | None) -> None:
        self.decision_ref = decision_ref

    def checking_token(self, checking: bool) -> None:
        """GS-02: while a bearer is being verified a refusal is an `auth.token` record."""
        self.action = TOKEN_ACTION if checking else QUERY_ACTION

    def failed(self, code: str, status: int) -> None:
        """A refusal (401/403) is `denied`; anything else an `error`, with its code as reason."""
        outcome = "denied" if status in (401, 403) else "error"
        resources: list[str | None] = [self.current] if self.current else [*self.touched]
        for resource in resources or [None]:
            self.record(resource, outcome, code)

    def succeeded(self) -> None:
        resources: list[str | None] = [*self.touched]
        for resource in resources or [None]:
            self.record(resource, "allowed")

    def record(self, resource: str | None, outcome: str, reason: str | None = None) -> None:
        fields: dict[str, Any] = {
            "service": "query-gateway",
            "sub": self.sub,
            "client_id": self.client_id,
            "service_account": self.service_account,
            "action": self.action,
            "method": self.method,
            "route": self.route,
            "resource": resource,
            "outcome": outcome,
            "reason": reason,
            "request_id": self.request_id,
            "trace_id": self.trace_id,
        }
        if self.agreement_id is not None:
            fields["agreement_id"] = _clean(self.agreement_id)
        if self.decision_ref is not None:
            fields["decision_ref"] = _clean(self.decision_ref)
        if outcome == "denied":
            log.warning("denied", **fields)
        else:
            log.info("access", **fields)
