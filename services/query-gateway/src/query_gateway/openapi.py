"""What the gateway's OpenAPI document says about its answers: the page and the plan, the headers
each query route reads, and the refusals of each route with their codes. Read once, when the
document is built; the routes answer as they did (`routes.py`), none of this runs per request."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dataplane_service_kit.errors import PROBLEM_JSON
from dataplane_service_kit.openapi import REQUEST_ID, error_responses, error_schema


class QueryPage(BaseModel):
    """One page of the narrowed statement's rows."""

    model_config = ConfigDict(extra="forbid")

    items: list[dict[str, Any]] = Field(description="the rows, each an object by column name")
    offset: int = Field(description="the offset applied (a negative one is read as 0)")
    limit: int = Field(
        description="the limit applied: 100 for none or ≤ 0, at most 10 000, at most the smallest "
        "`max_rows` of the touched datasets"
    )
    count: int = Field(description="rows in this page")
    total: int | None = Field(description="rows of the whole answer; null with `skip_count`")


class PlanParameter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    param: str = Field(description="`$1`, `$2`, …")
    label: str = Field(description="what the bound value is; never the value")


class ExposedColumn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    mask: Literal["null", "hash"] | None = Field(
        default=None,
        description="absent: the value as stored; `null`: reads as NULL; `hash`: a keyed pseudonym",
    )


class DatasetExposure(BaseModel):
    model_config = ConfigDict(extra="forbid")

    declared: bool = Field(
        description="the catalogue names the columns (a `columns:` list); else every column"
    )
    columns: list[ExposedColumn]


class QueryPlan(BaseModel):
    """`POST /query/plan`: the statement as it would run, its parameters labelled."""

    model_config = ConfigDict(extra="forbid")

    sql: str
    params: list[PlanParameter]
    denied: bool = Field(description="some row filter admits no row: the statement selects none")
    exposure: dict[str, DatasetExposure] = Field(
        description="per touched dataset, the columns a statement can reach and their masks"
    )


LIMIT_CLAMPED = {
    "X-Limit-Clamped": {
        "required": False,
        "description": "present when the page's `limit` is not the one asked for (QE-01: 0 or less "
        "means 100, above 10 000 means 10 000; QE-07: above a touched dataset's `max_rows` means "
        "that): the `limit` the request asked for",
        "schema": {"type": "string"},
    }
}

# read from the request by the route itself (not declared as parameters: no per-request binding)
TRACE_HEADERS: list[dict[str, Any]] = [
    {
        "name": "X-Request-ID",
        "in": "header",
        "required": False,
        "description": "names the request in the access record and the answer's `X-Request-ID` "
        "(1 to 128 visible ASCII characters; anything else is replaced by a new id)",
        "schema": {"type": "string"},
    },
    {
        "name": "X-Correlation-ID",
        "in": "header",
        "required": False,
        "description": "read when `X-Request-ID` is absent",
        "schema": {"type": "string"},
    },
    {
        "name": "traceparent",
        "in": "header",
        "required": False,
        "description": "W3C trace context: the request's server span continues the caller's trace",
        "schema": {"type": "string"},
    },
]

AUTHORIZATION = (
    "`Bearer <token>`: an OIDC access token of the configured issuer (normal path, optional for "
    "open datasets); with `Edc-Contract-Agreement-Id` on a dataspace gateway, the EDR token"
)
AGREEMENT = (
    "the contract agreement: on a gateway with `EDR_ENABLED`, its presence makes `POST /query` "
    "the legacy EDR path; on a pull, it must match the data flow's agreement"
)
TRANSFER = "the transfer process, passed to ds with the authorize question (dataspace paths)"
PURPOSE = "comma-separated purposes, passed to ds with the authorize question (dataspace paths)"
PULL_AUTHORIZATION = "`Bearer <pull token>`: the token of the data address signaling issued (DPS-06)"

# The bearer of each door, as OpenAPI carries it: an `Authorization` header *parameter* is ignored
# by the specification, so viewers and generated clients would send no token (the routes read the
# header themselves and keep it out of their parameters)
SECURITY_SCHEMES = {
    "oidcBearer": {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "JWT",
        "description": "an OIDC access token of the configured issuer (normal path; optional for "
        "a dataset open to anonymous readers)",
    },
    "edrToken": {
        "type": "http",
        "scheme": "bearer",
        "description": "the EDR token, with `Edc-Contract-Agreement-Id`, on a gateway with "
        "`EDR_ENABLED` (the legacy EDR path)",
    },
    "pullToken": {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "JWT",
        "description": "the pull token of the data address signaling issued (DPS-06)",
    },
}
QUERY_SECURITY: list[dict[str, list[str]]] = [{"oidcBearer": []}, {"edrToken": []}, {}]
PLAN_SECURITY: list[dict[str, list[str]]] = [{"oidcBearer": []}, {}]
PULL_SECURITY: list[dict[str, list[str]]] = [{"pullToken": []}]

# refusals every query route shares: the body, the statement, the row filters
_BODY = ("invalid_body", "body_too_large", "invalid_request")
_STATEMENT = (
    "sql_refused",
    "unknown_dataset",
    "ambiguous_dataset",
    "sql_too_long",
    "invalid_text",
    "column_not_exposed",
)
_FILTERS = ("row_filter_invalid", "row_filter_unenforceable", "row_filter_unavailable", "row_policy_denied")
_EXECUTION = (
    "query_timeout",
    "query_failed",
    "query_too_expensive",
    "query_resources_exceeded",
    "database_unavailable",
    "database_busy",
)
# GS-14: the consumer's bucket of a touched dataset, shared by every replica
_LIMITS = ("rate_limited", "rate_limit_unavailable", "too_many_concurrent_queries")
RETRY_AFTER = {
    429: {
        "Retry-After": {
            "required": True,
            "description": "whole seconds until the consumer's bucket holds a token again",
            "schema": {"type": "string"},
        }
    }
}
_NORMAL = ("invalid_token", "auth_required", "policy", "not_available")
_DATASPACE = (
    "not_offered",
    "not_available",
    "ds_refused",
    "row_filter_unreadable",
    "ds_unavailable",
    "audit_unavailable",
    "ds_not_configured",
)


def _ok(model: object, description: str, page: bool = True) -> dict[int | str, dict[str, Any]]:
    headers = {**REQUEST_ID, **(LIMIT_CLAMPED if page else {})}
    return {200: {"model": model, "description": description, "headers": headers}}


QUERY_RESPONSES = {
    **_ok(QueryPage, "a page of the rows the caller may read"),
    **error_responses(
        *_BODY,
        *_STATEMENT,
        *_FILTERS,
        *_EXECUTION,
        *_NORMAL,
        "provider_not_served",  # EDR path: the token's issuer is a provider this plane does not serve
        *_DATASPACE,
        *_LIMITS,
        headers=RETRY_AFTER,
    ),
}
PLAN_RESPONSES = {
    **_ok(QueryPlan, "the narrowed statement, nothing executed", page=False),
    **error_responses(*_BODY, *_STATEMENT, *_FILTERS, *_NORMAL, *_LIMITS, headers=RETRY_AFTER),
}
PULL_RESPONSES = {
    **_ok(QueryPage, "a page of the rows the data flow's agreement admits"),
    **error_responses(
        *_BODY,
        *_STATEMENT,
        *_FILTERS,
        *_EXECUTION,
        "pull_token",
        "pull_token_expired",
        "flow_not_started",
        "agreement_mismatch",
        "provider_not_served",
        *_DATASPACE,
        *_LIMITS,
        headers=RETRY_AFTER,
    ),
}

# ------------------------------------------------------------------ the records API (docs/records.md)


class RecordsPage(BaseModel):
    """One page of a flow's records, in record-key order."""

    model_config = ConfigDict(extra="forbid")

    items: list[dict[str, Any]] = Field(description="the records, each an object by column name")
    limit: int = Field(
        description="the limit applied: 100 when absent, at most 1 000, at most the dataset's `max_rows`"
    )
    has_more: bool = Field(description="whether records follow this page (of the filtered answer)")
    next_cursor: str | None = Field(
        description="opaque; the next page with the same filters, null at the end"
    )


class Tombstone(BaseModel):
    """A record that stopped being visible to the session: its key alone, no data."""

    model_config = ConfigDict(extra="forbid")

    key: Any = Field(description="the record key: its value, or the list of values of a composite key")
    tombstone: Literal[True]


class ChangesPage(BaseModel):
    """One answer of a `changes_since` session, in change order."""

    model_config = ConfigDict(extra="forbid")

    items: list[Tombstone | dict[str, Any]] = Field(
        description="records that changed and are visible, each an object by column name, and tombstones"
        ' (`{"key": ..., "tombstone": true}`) of records that changed and are not'
    )
    limit: int = Field(description="as for a page")
    has_more: bool = Field(description="whether more changes below the horizon follow at once")
    next_changes_since: str = Field(
        description="opaque; the session's next request, with the same filters (also when has_more is false)"
    )


class StreamQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    range_filters: dict[str, list[Literal["gte", "gt", "lte", "lt"]]] = Field(
        description="the flow's frozen filters: field → operators"
    )
    range_filter_types: dict[str, Literal["integer", "number", "date", "date-time"]] = Field(
        description="the flow's frozen filters: field → type"
    )


class StreamMetadata(BaseModel):
    """The stream as the flow was granted it: its frozen filter set, nothing of the catalogue now."""

    model_config = ConfigDict(extra="forbid")

    name: str
    query: StreamQuery


def _profile_status(responses: dict[int | str, dict[str, Any]]) -> dict[int | str, dict[str, Any]]:
    """`invalid_request` also at 400: the records routes answer a malformed query string with
    the range-filter profile's status (a path parameter FastAPI refuses stays 422)."""
    listed = responses.get(400)
    codes = tuple(listed["content"][PROBLEM_JSON]["schema"]["properties"]["error"]["enum"]) if listed else ()
    merged = (*codes, "invalid_request")
    responses[400] = {
        "description": "the request cannot be served as sent: " + ", ".join(f"`{c}`" for c in merged),
        "content": {PROBLEM_JSON: {"schema": error_schema(merged, 400)}},
        "headers": REQUEST_ID,
    }
    return responses


_PULL = ("pull_token", "pull_token_expired", "flow_not_started", "agreement_mismatch", "not_offered")
STREAM_RESPONSES = _profile_status(
    {
        **_ok(StreamMetadata, "the flow's frozen client range filters"),
        **error_responses("invalid_request", "database_unavailable", "grant_invalid", *_PULL),
    }
)
RECORDS_RESPONSES = _profile_status(
    {
        **_ok(
            RecordsPage | ChangesPage,
            "a page of the records the flow's agreement and its filters admit, or a change session's answer",
        ),
        **error_responses(
            "invalid_request",
            "invalid_cursor",
            "resync_required",
            "grant_invalid",
            *_FILTERS,
            *_EXECUTION,
            *_PULL,
            "provider_not_served",
            *_DATASPACE,
            *_LIMITS,
            headers=RETRY_AFTER,
        ),
    }
)
RECORDS_QUERY: list[dict[str, Any]] = [
    {
        "name": "limit",
        "in": "query",
        "required": False,
        "description": "records per page: 100 when absent, at most 1 000 (more is read as 1 000)",
        "schema": {"type": "integer", "minimum": 1, "maximum": 999_999_999},
    },
    {
        "name": "cursor",
        "in": "query",
        "required": False,
        "description": "the `next_cursor` of the previous page, with the same filters",
        "schema": {"type": "string", "minLength": 1},
    },
    {
        "name": "changes_since",
        "in": "query",
        "required": False,
        "description": "a change session: `beginning`, then the previous answer's `next_changes_since`,"
        " with the same filters (not with `cursor`); only on a dataset declaring `records.changes`",
        "schema": {"type": "string", "minLength": 1},
    },
    {
        "name": "wait",
        "in": "query",
        "required": False,
        "description": "with `changes_since` only: seconds an answer that would be empty waits for a change"
        " (at most 20, more is read as 20); every check is made again before a delivery",
        "schema": {"type": "integer", "minimum": 0, "maximum": 999_999_999},
    },
    {
        "name": "filter",
        "in": "query",
        "required": False,
        "style": "deepObject",
        "explode": True,
        "description": "`filter[<field>][<op>]=<value>`: a field and operator of the flow's frozen set",
        "schema": {"type": "object", "additionalProperties": {"type": "object"}},
    },
]

STREAM_DESCRIPTION = """\
The flow's dataset as its pull token was granted it: exactly the client range filters frozen
when the flow started, with their types, and nothing of the catalogue as it is now. Takes no
query parameter."""

RECORDS_DESCRIPTION = """\
A page of the flow's dataset in record-key order: the rows ds's decision and the catalogue's
layers admit, as on `POST /dps/public/query`, further narrowed by the client filters
(`filter[field][op]=value`, combined with AND) — only fields and operators of the flow's frozen
set. A malformed query string is `400 invalid_request`; a cursor of another filter set, flow or
dataset `400 invalid_cursor`; a malformed frozen set, or a filter that cannot be evaluated now,
`403 grant_invalid`. The disclosure is recorded before the page leaves.

With `changes_since` (`beginning`, then each answer's `next_changes_since`) it is a change
session: the records that changed since the token's horizon, in the order their writing
transactions ran, those still visible whole, those that stopped being visible (soft-deleted, out
of the filter range) as tombstones. A token of another flow, dataset or filter set is
`400 invalid_cursor`; one issued before ds's verdict, the row filters or the projection changed
is `409 resync_required`: start again from `beginning`."""

PROTECTED_RESOURCE_DESCRIPTION = """\
RFC 9728 metadata of the pull path, advertising `capabilities.client_range_filters`."""

QUERY_DESCRIPTION = """\
Runs one read-only SQL statement over the catalogue's datasets and answers one page of it.

Without `Edc-Contract-Agreement-Id` (or on a gateway without `EDR_ENABLED`) this is the
**normal path**: the caller is the OIDC bearer (or anonymous for open datasets) and the row
filters of the catalogue apply. With the header on an EDR gateway it is the **legacy EDR path**:
the bearer is the EDR token, ds decides per dataset and every served page's disclosure is
published before the answer leaves."""

PULL_DESCRIPTION = """\
A DPS pull (DPS-09): the bearer is the pull token of a STARTED data flow; ds decides per dataset
as on the EDR path. Served only by a gateway with `DPS_ENABLED` (DPS-01)."""

PLAN_DESCRIPTION = """\
The normal path up to execution: the statement as the row filters narrow it, each bound
parameter labelled (never its value). Nothing runs against the datasets."""

__all__ = [
    "AGREEMENT",
    "AUTHORIZATION",
    "PLAN_DESCRIPTION",
    "PLAN_RESPONSES",
    "PLAN_SECURITY",
    "PROTECTED_RESOURCE_DESCRIPTION",
    "PULL_AUTHORIZATION",
    "PULL_DESCRIPTION",
    "PULL_RESPONSES",
    "PULL_SECURITY",
    "PURPOSE",
    "QUERY_DESCRIPTION",
    "QUERY_RESPONSES",
    "QUERY_SECURITY",
    "RECORDS_DESCRIPTION",
    "RECORDS_QUERY",
    "RECORDS_RESPONSES",
    "SECURITY_SCHEMES",
    "STREAM_DESCRIPTION",
    "STREAM_RESPONSES",
    "TRACE_HEADERS",
    "TRANSFER",
]
