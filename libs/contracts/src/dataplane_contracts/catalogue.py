"""The catalogue file: datasets, physical tables, access levels, exposure, the columns a dataset
exposes (each optionally masked), and the two layers of each dataset's row policy (person,
organization), each `{handler, args, binds}`."""

from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, StrictBool, StrictStr, field_validator, model_validator

from dataplane_contracts.base import ContractModel
from dataplane_contracts.records import RecordsSpec

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
# Handlers that answer only for the caller's own rows: a delegated request (one naming subjects)
# cannot be resolved by them (RF-06). The gateway refuses the pure ones, the resolver the others.
REFUSES_DELEGATION = frozenset({"http_in_list", "table_pointer", "organization_match", "member_wide"})

_IDENT = re.compile(r'^("[^"]+"|[A-Za-z_][A-Za-z0-9_$]*)(\.("[^"]+"|[A-Za-z_][A-Za-z0-9_$]*))?$')


class RowFilterSpec(ContractModel):
    handler: StrictStr = Field(min_length=1)
    args: dict[str, Any] = Field(default_factory=dict)
    binds: Binds | None = None

    @property
    def column(self) -> str | None:
        col = self.args.get("column")
        return col if isinstance(col, str) and col else None


Mask = Literal["null", "hash"]


class ColumnSpec(ContractModel):
    """One exposed column: its name in the table, as PostgreSQL stores it, and its mask — `null`
    (the column reads as NULL of its type), `hash` (a keyed, stable pseudonym of its value) or
    `none` (the default: as it is)."""

    name: StrictStr = Field(min_length=1, max_length=63)
    mask: Mask | Literal["none"] = "none"  # "none": the value as it is

    @model_validator(mode="before")
    @classmethod
    def _mask_spelled_out(cls, data: Any) -> Any:
        # YAML reads a bare `mask: null` as no value at all, which would leave the column whole:
        # refuse it rather than guess, and say how to write the mask
        if isinstance(data, dict) and "mask" in data and data["mask"] is None:
            raise ValueError("mask: null is YAML's null, not a mask; write mask: 'null' (quoted)")
        return data


def _column_spec(value: Any) -> Any:
    """A bare name is an unmasked column: `- pod` reads as `- {name: pod}`."""
    return {"name": value} if isinstance(value, str) else value


class RateLimitSpec(ContractModel):
    """A dataset's token bucket per consumer (docs/gateway.md, GS-14): `per_second` tokens added
    each second, at most `burst` held; a read takes one."""

    per_second: float = Field(gt=0, le=1_000_000)
    burst: int = Field(ge=1, le=1_000_000)


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
    # None: every column of the table, unmasked (catalogues written before column exposure)
    columns: list[ColumnSpec] | None = Field(default=None, min_length=1)
    # the records API (docs/records.md): record key and range filters; None: no records route
    records: RecordsSpec | None = None
    # the most rows one page of this dataset may carry, beside the global cap (QE-07); None: the
    # global cap alone
    max_rows: int | None = Field(default=None, ge=1)
    # this dataset's bucket per consumer (GS-14); None: RATE_LIMIT_PER_SECOND/RATE_LIMIT_BURST
    rate_limit: RateLimitSpec | None = None

    @field_validator("columns", mode="before")
    @classmethod
    def _names_are_specs(cls, v: Any) -> Any:
        return [_column_spec(c) for c in v] if isinstance(v, list) else v

    @field_validator("columns")
    @classmethod
    def _columns_once(cls, v: list[ColumnSpec] | None) -> list[ColumnSpec] | None:
        names = [c.name for c in v or ()]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"columns lists {twice[0]} more than once")
        return v

    @property
    def masks(self) -> dict[str, Mask]:
        """Masked column → its mask."""
        return {c.name: c.mask for c in self.columns or () if c.mask != "none"}

    @field_validator("table")
    @classmethod
    def _table_is_identifier(cls, v: str) -> str:
        if not _IDENT.fullmatch(v):
            raise ValueError("table must be [schema.]name")
        return v

    @model_validator(mode="after")
    def _records_exposed(self) -> DatasetEntry:
        """The record key and every range-filter field are exposed, unmasked columns: a page's
        order and a filter may only use values the consumer reads anyway (no probing of a hidden
        or masked value)."""
        if self.records is None:
            return self
        names = {c.name for c in self.columns} if self.columns is not None else None
        for role, fields in (
            ("records.key", self.records.key),
            ("records.range_filters", self.records.range_filters),
        ):
            for name in fields:
                if names is not None and name not in names:
                    raise ValueError(f"dataset {self.id}: {role} field {name} is not an exposed column")
                if name in self.masks:
                    raise ValueError(f"dataset {self.id}: {role} field {name} is a masked column")
        return self

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

    def binds_of(self, handler: str) -> Binds | Literal["unknown"] | None:
        """GS-08: "person"/"organization" for a built-in, or for a plugin this catalogue declares
        with its binds; None for allow_all/deny_all; "unknown" for a stranger."""
        if handler in HANDLER_BINDS:
            return HANDLER_BINDS[handler]
        return self._plugin_binds.get(handler, "unknown")

    @cached_property
    def _plugin_binds(self) -> dict[str, Binds]:
        """A plugin is known to this data plane when the catalogue declares it (with its binds)."""
        out: dict[str, Binds] = {}
        for entry in self.datasets:
            for spec in (entry.row_filters.person, entry.row_filters.organization):
                if spec is not None and spec.handler not in HANDLER_BINDS and spec.binds is not None:
                    out[spec.handler] = spec.binds
        return out


def load_catalogue(path: str | Path) -> Catalogue:
    """Read and validate the catalogue YAML; raises ValueError / pydantic.ValidationError."""
    raw = yaml.safe_load(Path(path).read_text())
    return Catalogue.model_validate(raw)
