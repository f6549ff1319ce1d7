"""How `dataplane-local demo` prints what crosses the wire: every JWT shortened, every secret
redacted, the keys in ds's verdicts masked, and each body printed as complete JSON — a long list
or string is shortened by an explicit marker inside the JSON, never cut off mid-document, so what
is printed still parses."""

from __future__ import annotations

import json
import re
from typing import Any

_JWT = re.compile(r"eyJ[\w-]+\.[\w-]+\.[\w-]*")
_SECRET_KEYS = {"access_token", "refresh_token", "id_token", "token", "client_secret", "refreshToken"}
# DSP endpoint properties (`{name, value}`) whose value is a credential
_SECRET_PROPERTIES = _SECRET_KEYS | {"authorization"}
# a list longer than this shows its first items and one marker element saying how many follow
MAX_ITEMS = 6
# a string longer than this (after token redaction) keeps its start and a marker
MAX_STRING = 160


def redact(text: str) -> str:
    """Every JWT shortened to its first characters, so nothing printed can be replayed."""
    return _JWT.sub(lambda m: m.group(0)[:10] + "…(redacted)", text)


def mask_key(key: str) -> str:
    """`pod:IT001E00000001` → `pod:IT0…01`: enough to tell two keys apart, not to name a household."""
    kind, sep, value = key.rpartition(":")
    if len(value) <= 5:
        return f"{kind}{sep}…"
    return f"{kind}{sep}{value[:3]}…{value[-2:]}"


def redact_json(value: Any) -> Any:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if k in _SECRET_KEYS and isinstance(v, str):
                out[k] = v[:6] + "…(redacted)"
            elif k.lower().endswith("authorization") and isinstance(v, str):
                out[k] = redact(v) if _JWT.search(v) else "…(redacted)"
            elif k == "value" and str(value.get("name", "")).rsplit("/", 1)[-1] in _SECRET_PROPERTIES:
                out[k] = redact(v) if isinstance(v, str) and _JWT.search(v) else "…(redacted)"
            else:
                out[k] = redact_json(v)
        return out
    if isinstance(value, list):
        return [redact_json(v) for v in value]
    return redact(value) if isinstance(value, str) else value


def mask_verdict_keys(value: Any) -> Any:
    """ds's answer with every row-filter key masked (the keys are supply points: personal)."""
    if isinstance(value, dict):
        return {
            k: [mask_key(x) if isinstance(x, str) else x for x in v]
            if k == "keys" and isinstance(v, list)
            else mask_verdict_keys(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [mask_verdict_keys(v) for v in value]
    return value


def elide(value: Any) -> Any:
    """The same JSON value with long lists and strings shortened by markers inside it."""
    if isinstance(value, dict):
        return {k: elide(v) for k, v in value.items()}
    if isinstance(value, list):
        if len(value) > MAX_ITEMS:
            kept = [elide(v) for v in value[: MAX_ITEMS - 1]]
            return [*kept, f"…({len(value) - len(kept)} more)"]
        return [elide(v) for v in value]
    if isinstance(value, str) and len(value) > MAX_STRING:
        return value[:MAX_STRING] + f"…({len(value)} chars)"
    return value


# a JSON value that fits in this many characters stays on one line; a longer one is spread out
LINE = 96


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(", ", ": "), default=str, ensure_ascii=False)


def _pretty(value: Any, depth: int) -> list[str]:
    """JSON text lines: a container that fits on one line stays there, a longer one gets a line
    per member (indented two spaces a level) — the output is still one valid JSON document."""
    pad = "  " * depth
    flat = _compact(value)
    if not isinstance(value, dict | list) or not value or len(pad) + len(flat) <= LINE:
        return [flat]
    members: list[list[str]] = []
    if isinstance(value, dict):
        for k, v in value.items():
            inner = _pretty(v, depth + 1)
            members.append([f"{_compact(str(k))}: {inner[0]}", *inner[1:]])
        opening, closing = "{", "}"
    else:
        members = [_pretty(v, depth + 1) for v in value]
        opening, closing = "[", "]"
    lines = [opening]
    for i, member in enumerate(members):
        comma = "," if i < len(members) - 1 else ""
        lines.append(f"{pad}  {member[0]}")
        lines.extend(member[1:])
        lines[-1] += comma
    lines.append(pad + closing)
    return lines


def show_body(body: Any, indent: str = "      ") -> str:
    """The body as printed: redacted, elided, complete JSON, each line indented."""
    if body is None:
        return ""
    return "\n".join(indent + line for line in _pretty(elide(redact_json(body)), 0))


def one_line(body: Any) -> str:
    """The same as `show_body`, on one line (short answers, summaries)."""
    return json.dumps(elide(redact_json(body)), separators=(",", ":"), default=str, ensure_ascii=False)
