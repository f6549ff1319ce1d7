"""Start-up validation of settings: a wrong variable stops the service with its name."""

from __future__ import annotations

import sys
from typing import TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings

S = TypeVar("S", bound=BaseSettings)


class ConfigurationError(SystemExit):
    """Raised (as SystemExit code 2) when configuration is invalid."""


def describe_validation_error(exc: ValidationError, cls: type[BaseSettings]) -> str:
    prefix = str(cls.model_config.get("env_prefix") or "")
    lines = []
    for err in exc.errors():
        if not err["loc"]:
            # a model-level check: its message names the variables itself
            lines.append(f"invalid configuration: {err['msg']}")
            continue
        field = ".".join(str(p) for p in err["loc"])
        info = cls.model_fields.get(str(err["loc"][0])) if err["loc"] else None
        alias = info.validation_alias if info is not None else None
        name = alias if isinstance(alias, str) else f"{prefix}{field}".upper()
        # the input value is deliberately not echoed: it may be a secret
        lines.append(f"invalid configuration: {name}: {err['msg']}")
    return "\n".join(lines)


def load_settings(cls: type[S]) -> S:
    """Build settings from the environment or exit(2) naming each wrong variable."""
    try:
        return cls()
    except ValidationError as exc:
        print(describe_validation_error(exc, cls), file=sys.stderr)
        raise ConfigurationError(2) from None
