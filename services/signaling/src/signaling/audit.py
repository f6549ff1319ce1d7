"""GS-02 access records for signalling: one structured line on logger `dataplane.audit` per
refused signal. The caller is named only once its token verified; a token never appears."""

from __future__ import annotations

import logging

from fastapi import Request

from dataplane_service_kit.logs import AUDIT_LOGGER, get_logger
from dataplane_service_kit.request_ids import from_scope

_audit = get_logger(AUDIT_LOGGER)


def route_template(request: Request) -> str:
    """The path with its parameters named (`/dps/v1/dataflows/{flow_id}/suspend`): ids stay out
    of the record's route field (they are not needed to read the trail by route)."""
    segments = request.url.path.split("/")
    names = {str(v): k for k, v in request.path_params.items()}
    return "/".join(f"{{{names[s]}}}" if s in names else s for s in segments)


def signal_refused(
    request: Request, reason: str, status: int, caller: str | None = None, action: str = "dps.signal"
) -> None:
    # the audit trail must not depend on LOG_LEVEL
    logging.getLogger(AUDIT_LOGGER).setLevel(logging.INFO)
    _audit.warning(
        "denied",
        service="signaling",
        action=action,
        outcome="denied",
        reason=reason,
        status=status,
        client_id=caller,
        method=request.method,
        route=route_template(request),
        request_id=from_scope(request.scope),  # the id the answer carries (X-Request-ID)
    )
