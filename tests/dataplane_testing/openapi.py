"""Schemathesis against a served OpenAPI document: every operation, valid and invalid requests
generated from the document, each answer checked — no 5xx, a documented status, content type,
headers and body. Shared by the gateway's and signaling's tests."""

from __future__ import annotations

import re
from typing import Any

import httpx
import schemathesis

# schemathesis imports its OpenAPI loader lazily, on the first `from_url`; pytest rewrites that
# module's source then, deep inside a running test, where Python 3.11.7's ast.parse can fail
# ("AST constructor recursion depth mismatch", seen on a clean clone with no rewrite cache).
# Importing it here does that work once, at collection, on a shallow stack.
import schemathesis.specs.openapi.schemas
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]

# few examples per operation and mode: the suite's budget for both documents is about a minute
# on a loaded 2-core machine (the requests are the same on every run: derandomized)
EXAMPLES = 8


def load(base_url: str) -> Any:
    """The document as the service serves it (its requests go to the same server)."""
    return schemathesis.openapi.from_url(f"{base_url}/openapi.json")


def operations(schema: Any) -> dict[str, Any]:
    return {f"{op.method.upper()} {op.path}": op for op in (r.ok() for r in schema.get_all_operations())}


def run_operation(op: Any, headers: dict[str, str] | None = None, examples: int = EXAMPLES) -> int:
    """Generated requests of both modes against one operation; every answer checked. An invalid
    request must also be refused (a 4xx), never served. Returns how many were sent."""
    sent = [0]
    for mode, checks in (
        (GenerationMode.POSITIVE, CHECKS),
        (GenerationMode.NEGATIVE, [*CHECKS, negative_data_rejection]),
    ):
        try:
            _generated(op, mode, checks, headers, examples, sent)()
        except Unsatisfiable:
            if mode is GenerationMode.POSITIVE:
                raise
            # an operation without parameters or body (GET /healthz): no request is invalid
    return sent[0]


def _generated(
    op: Any,
    mode: GenerationMode,
    checks: list[Any],
    headers: dict[str, str] | None,
    examples: int,
    sent: list[int],
) -> Any:
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,  # the same requests on every run: a failure is reproduced as it is
        suppress_health_check=list(HealthCheck),
    )
    @given(case=op.as_strategy(generation_mode=mode))
    def check(case: Any) -> None:
        case.call_and_validate(headers=headers, checks=checks)
        sent[0] += 1

    return check


def call_checked(op: Any, **request: Any) -> Any:
    """One request only a test can make valid (a real token, a known dataset), its answer
    checked the same way; the response, for the test's own assertions."""
    return op.Case(**request).call_and_validate(checks=CHECKS)


def docs_served_from_the_package(url: str) -> None:
    """`GET /docs` is the viewer, and every script and style it loads is the service's own (issue
    33: no CDN, so it works on a cluster without internet access)."""
    docs = httpx.get(f"{url}/docs")
    assert docs.status_code == 200 and "/openapi.json" in docs.text
    assets = re.findall(r'(?:src|href)="([^"]+)"', docs.text)
    assert assets and all(a.startswith("/openapi-viewer/") for a in assets), assets
    for asset in assets:
        got = httpx.get(f"{url}{asset}")
        assert got.status_code == 200 and len(got.content) > 100, asset
