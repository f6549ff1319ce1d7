"""Typed outcomes of a failed resolution.

A `ResolveError` is a final answer with a code of the contracts table; its detail names the
handler and, for an upstream, the status and code it answered — never a principal, key, token,
URL or argument value (RF-08). A `TransientUpstream` is a failure worth retrying (a 5xx)."""

from __future__ import annotations

from dataplane_contracts.errors import ErrorCode


class ResolveError(Exception):
    def __init__(self, code: ErrorCode, detail: str) -> None:
        super().__init__(detail)
        self.code: ErrorCode = code
        self.detail = detail


def invalid(detail: str) -> ResolveError:
    """A filter that cannot be applied as declared (500 `row_filter_invalid`)."""
    return ResolveError("row_filter_invalid", detail)


def unenforceable(detail: str) -> ResolveError:
    """An unknown handler, or one that refuses delegation (RF-06, 403)."""
    return ResolveError("row_filter_unenforceable", detail)


def unavailable(detail: str) -> ResolveError:
    """No answer could be had: never read as a deny, never as a pass (RF-05, RF-12)."""
    return ResolveError("row_filter_unavailable", detail)


class TransientUpstream(Exception):
    """An upstream answered 5xx: retried like a connection error or a timeout."""
