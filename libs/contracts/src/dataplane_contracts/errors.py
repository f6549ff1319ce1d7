"""The one error table (docs/wire-contracts.md, "Errors"): stable codes and their statuses. The body
is the problem document the service kit renders (libs/service-kit/src/dataplane_service_kit/errors.py)."""

from __future__ import annotations

from typing import Literal, get_args

ErrorCode = Literal[
    "sql_refused",
    "unknown_dataset",
    "ambiguous_dataset",
    "column_not_exposed",
    "query_timeout",
    "query_failed",
    "query_too_expensive",
    "query_resources_exceeded",
    "sql_too_long",
    "invalid_text",
    "body_too_large",
    "invalid_body",
    "invalid_request",
    "invalid_cursor",
    "resync_required",
    "auth_required",
    "invalid_token",
    "provider_not_served",
    "pull_token",
    "pull_token_expired",
    "unsupported_grant_type",
    "invalid_refresh_request",
    "refresh_token_invalid",
    "client_auth_required",
    "client_jwt_invalid",
    "client_did_unresolvable",
    "client_not_counter_party",
    "client_audience",
    "client_jwt_replayed",
    "policy",
    "not_available",
    "not_offered",
    "ds_refused",
    "row_policy_denied",
    "row_filter_unenforceable",
    "flow_not_started",
    "agreement_mismatch",
    "grant_invalid",
    "no_token",
    "client_not_admitted",
    "unsupported_transfer_type",
    "data_address_not_allowed",
    "data_address_required",
    "callback_address_required",
    "flow_not_found",
    "control_plane_not_found",
    "flow_exists",
    "invalid_transition",
    "control_plane_taken",
    "invalid_message",
    "row_filter_unreadable",
    "ds_unavailable",
    "row_filter_invalid",
    "internal_error",
    "row_filter_unavailable",
    "audit_unavailable",
    "database_unavailable",
    "ds_not_configured",
    "not_ready",
    "rate_limited",
    "rate_limit_unavailable",
    "too_many_concurrent_queries",
    "database_busy",
]

ERROR_CODES: tuple[str, ...] = get_args(ErrorCode)

STATUS: dict[str, int] = {
    "sql_refused": 400,
    "unknown_dataset": 400,
    "ambiguous_dataset": 400,
    "column_not_exposed": 400,  # the same answer whether the column exists unexposed or not at all
    "query_timeout": 400,
    "query_failed": 400,
    "query_too_expensive": 400,  # PostgreSQL's estimate of the plan is above QUERY_MAX_PLAN_COST
    # the statement ran into the reader's memory or temporary-file bounds (work_mem, temp_file_limit)
    "query_resources_exceeded": 400,
    "sql_too_long": 400,
    "invalid_text": 400,  # a lone surrogate or a NUL: text PostgreSQL cannot take
    "body_too_large": 413,
    "invalid_body": 400,  # not a JSON document: invalid UTF-8, or not JSON at all
    "invalid_request": 422,  # 400 on the records routes, as the range-filter profile fixes it
    "invalid_cursor": 400,  # a records cursor tampered with, or presented with another filter set
    # a changes_since token whose visibility context (ds's verdict, row filters, projection) is no
    # longer the flow's: the client starts again from `beginning` (docs/records.md)
    "resync_required": 409,
    "auth_required": 401,
    "invalid_token": 401,
    "provider_not_served": 401,
    "pull_token": 401,
    "pull_token_expired": 401,  # an http-pull access token past its exp: renew it
    "unsupported_grant_type": 400,  # a renewal whose grant_type is not refresh_token
    "invalid_refresh_request": 400,  # a renewal that is not a form with a refresh_token
    "refresh_token_invalid": 400,  # never issued, already retired, or its flow not STARTED
    "client_auth_required": 401,  # a renewal without the client's bearer JWT
    "client_jwt_invalid": 401,  # not signed by the DID's key, expired, malformed, or naming another token
    "client_did_unresolvable": 401,  # the client's did:web document cannot be read
    "client_not_counter_party": 401,  # the client DID is not the flow's counter-party
    "client_audience": 401,  # the client JWT's aud is not the flow's provider
    "client_jwt_replayed": 401,  # a client JWT id seen before
    "no_token": 401,
    "policy": 403,
    "not_available": 403,
    "not_offered": 403,
    "ds_refused": 403,
    "row_policy_denied": 403,
    "row_filter_unenforceable": 403,
    "flow_not_started": 403,
    "agreement_mismatch": 403,
    "grant_invalid": 403,  # a flow's frozen range-filter set malformed, or one it asks for unevaluable
    "client_not_admitted": 403,
    "unsupported_transfer_type": 400,
    "data_address_not_allowed": 400,
    "data_address_required": 400,
    "callback_address_required": 400,  # an asynchronous signal with nowhere to send its callback
    "flow_not_found": 404,
    "control_plane_not_found": 404,
    "flow_exists": 409,
    "invalid_transition": 409,
    "control_plane_taken": 409,
    "invalid_message": 422,
    "row_filter_unreadable": 502,
    "ds_unavailable": 502,
    "row_filter_invalid": 500,
    "internal_error": 500,  # a fault of ours: logged by type, answered without any detail of it
    "row_filter_unavailable": 503,
    "audit_unavailable": 503,
    "database_unavailable": 503,
    "ds_not_configured": 503,
    "not_ready": 503,
    "rate_limited": 429,  # the consumer's token bucket for a dataset is empty; Retry-After says when
    "rate_limit_unavailable": 503,  # the limiter's store cannot be asked: refused, never served
    "too_many_concurrent_queries": 429,  # the consumer's statements already running fill its share
    "database_busy": 503,  # every pooled connection stayed in use past the wait bound
}

assert set(STATUS) == set(ERROR_CODES), "every code has exactly one status"


def status_of(code: ErrorCode) -> int:
    return STATUS[code]
