"""Base models: strict by default, tolerant only where a clause says so."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StrictInt, StrictStr


class ContractModel(BaseModel):
    """Unknown fields forbidden, immutable. Not model-wide strict: FastAPI/FastStream validate
    decoded JSON in Python mode, where UUIDs and datetimes arrive as strings."""

    # hide_input_in_errors (both bases): a ValidationError's text (str, repr, a log line quoting
    # it) must never echo the input, which is as likely as not a principal, a key, a token or a
    # whole message carrying them (RF-07, RF-08); `errors()` still names the field and the rule.
    # pydantic takes the setting of the outermost model, so it holds for a contracts model
    # validated on its own; a model outside the library that embeds one decides for itself.
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)


class TolerantModel(BaseModel):
    """A tolerant reader (RF-02's envelope, DPS-03's messages): unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True, hide_input_in_errors=True)


def _now() -> datetime:
    return datetime.now(UTC)


class Event(ContractModel):
    """Every Kafka event: identity, time and schema version, additive changes only."""

    event_id: uuid.UUID = Field(default_factory=uuid.uuid4)
    occurred_at: AwareDatetime = Field(default_factory=_now)
    schema_version: StrictInt = 1


NonEmptyStr = Annotated[StrictStr, Field(min_length=1)]
