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
    for noisy in ("aiokafka", "kafka"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    # access records stay at INFO whatever LOG_LEVEL says (GS-01)
    logging.getLogger(AUDIT_LOGGER).setLevel(logging.INFO)


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
