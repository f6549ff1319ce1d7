"""The catalogue file: datasets, physical tables, access levels, exposure, and the two layers of
each dataset's row policy (person, organization), each `{handler, args, binds}`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, StrictBool, StrictStr, field_validator, model_validator

from dataplane_contracts.base import ContractModel

Binds = Literal["person", "organization"]
AccessLevel = Literal["open", "internal", "restricted", "secret"]

# The built-in handler → binds table (GS-08). `allow_all` / `deny_all` serve either layer and so
# must state their binds; a plugin declares its own.
HANDLER_BINDS: dict[str, Binds | None] = {
    "direct_user_match": "person",
    "rec_registry": "person",
    "subject_key_match": "person",
    "http_in_list": "person",
    "table_pointer": "person",
    "organization_match": "organization",
    "member_wide": "organization",
    "allow_all": None,
    "deny_all": None,
}

# Handlers the gateway applies itself (pure); every other one is resolved by the filter-resolver.
PURE_HANDLERS = frozenset(
    {"subject_key_match", "direct_user_match", "organization_match", "member_wide", "allow_all", "deny_all"}
)
LOOKUP_HANDLERS = frozenset({"rec_registry", "http_in_list", "table_pointer"})

_IDENT = re.compile(r'^("[^"]+"|[A-Za-z_][A-Za-z0-9_$]*)(\.("[^"]+"|[A-Za-z_][A-Za-z0-9_$]*))?$')


class RowFilterSpec(ContractModel):
    handler: StrictStr = Field(min_length=1)
    args: dict[str, Any] = Field(default_factory=dict)
    binds: Binds | None = None

    @property
    def column(self) -> str | None:
        col = self.args.get("column")
        return col if isinstance(col, str) and col else None


class RowPolicy(ContractModel):
    person: RowFilterSpec | None = None
    organization: RowFilterSpec | None = None


class DatasetEntry(ContractModel):
    id: StrictStr = Field(min_length=1, max_length=255)
    table: StrictStr = Field(min_length=1)
    access_level: AccessLevel = "internal"
    expose: StrictBool = False
    dataspace_expose: StrictBool = False
    row_filters: RowPolicy = Field(default_factory=RowPolicy)

    @field_validator("table")
    @classmethod
    def _table_is_identifier(cls, v: str) -> str:
        if not _IDENT.fullmatch(v):
            raise ValueError("table must be [schema.]name")
        return v

    @model_validator(mode="after")
    def _binds_agree(self) -> DatasetEntry:
        """GS-08: a layer's filter binds that layer; a built-in's binds match the table."""
        for layer in ("person", "organization"):
            spec: RowFilterSpec | None = getattr(self.row_filters, layer)
            if spec is None:
                continue
            where = f"dataset {self.id}: row_filters.{layer} ({spec.handler})"
            expected = HANDLER_BINDS.get(spec.handler, "plugin")
            if spec.binds is None and (expected is None or expected == "plugin"):
                raise ValueError(f"{where} must declare binds")
            binds = spec.binds or expected
            if expected not in (None, "plugin") and binds != expected:
                raise ValueError(f"{where} binds {binds}, but the handler binds {expected}")
            if binds != layer:
                raise ValueError(f"{where} binds {binds}, so it cannot be the {layer} layer")
        return self


class Catalogue(ContractModel):
    datasets: list[DatasetEntry]

    @model_validator(mode="after")
    def _unique_ids(self) -> Catalogue:
        seen: set[str] = set()
        for entry in self.datasets:
            if entry.id in seen:
                raise ValueError(f"dataset {entry.id} is declared twice")
            seen.add(entry.id)
        return self

    def by_id(self) -> dict[str, DatasetEntry]:
        return {d.id: d for d in self.datasets}


def load_catalogue(path: str | Path) -> Catalogue:
    """Read and validate the catalogue YAML; raises ValueError / pydantic.ValidationError."""
    raw = yaml.safe_load(Path(path).read_text())
    return Catalogue.model_validate(raw)
