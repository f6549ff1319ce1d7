"""Structured JSON logging shared by every service.

structlog renders through stdlib logging so uvicorn, aiokafka and SQLAlchemy write into the same
JSON stream; the trace id is bound from the active OpenTelemetry span on every line.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import orjson
import structlog
from opentelemetry import trace


def _add_trace_id(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        event.setdefault("trace_id", format(ctx.trace_id, "032x"))
    return event


def _json_line(event: dict[str, Any], **kw: Any) -> str:
    """One event as a JSON line, with orjson (an access record per request is on the hot
    path); what orjson refuses — an integer beyond 64 bits, a lone surrogate — takes the
    standard encoder, with structlog's fallback for values JSON has no type for."""
    default = kw.get("default", str)
    try:
        return orjson.dumps(event, default=default).decode()
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(event, default=default)


# the access records' logger (GS-01, GS-02), shared by the services that write them
AUDIT_LOGGER = "dataplane.audit"


def configure_logging(service: str, level: str = "INFO") -> None:
    """Route structlog and stdlib logging into one JSON line per event on stderr."""
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _add_trace_id,
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        # the same processors every time this is called: a logger built once serves every line
        cache_logger_on_first_use=True,
    )
    _lean_records()
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            lambda _l, _m, ev: {"service": service, **ev},
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(serializer=_json_line),
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    quiet_libraries(root.level)
    # access records stay at INFO whatever LOG_LEVEL says (GS-01)
    logging.getLogger(AUDIT_LOGGER).setLevel(logging.INFO)


# libraries that log at INFO what is ours to log, or must not be logged at all. The Kafka clients:
# every connection and rebalance step. httpx and httpcore: a line per outgoing request with its
# URL, and a URL may carry personal data — an http_in_list URL the caller's values (RF-08), a
# did:web document's address the consumer's DID — so they stay quiet at DEBUG too
QUIET_LIBRARIES = ("aiokafka", "kafka", "httpx", "httpcore")


def quiet_libraries(level: int) -> None:
    """WARNING and above from QUIET_LIBRARIES (or `level`, when that is stricter)."""
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(max(logging.WARNING, level))


def _lean_records() -> None:
    """Leave out of every log record what no line of ours carries: the caller's file and line
    (`_srcfile = None` is the logging module's own switch for that: no frame walk per record),
    the thread, process and multiprocessing names. The formatter copies each record once more,
    so these are paid twice per line; an access record per request is on the hot path."""
    logging._srcfile = None  # the logging module documents this switch for exactly this
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(name)
    return logger
