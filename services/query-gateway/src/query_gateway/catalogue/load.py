"""The catalogue file, checked whole before it is served (docs/gateway.md, "GS-08"): the
schema (GS-08), every handler name known (built in, or a plugin the deployment's resolvers load,
`ROW_FILTERS_PLUGIN_HANDLERS`), every column in the database (GS-09), a mask key where a column is
masked by hash. Start-up refuses a file that fails any check; a reload (SIGHUP) keeps the file
being served and says why."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import yaml

from dataplane_contracts.catalogue import HANDLER_BINDS, Catalogue
from query_gateway.records.startup import check_records
from query_gateway.settings import Settings
from query_gateway.sql import (
    ColumnTypes,
    LeakproofOperators,
    MaskKey,
    hash_masks,
    load_column_types,
    load_leakproof_operators,
)


class CatalogueRefused(ValueError):
    """The file cannot be served; the message names the file and what is wrong (never a value
    of the database or a key)."""


@dataclass(frozen=True)
class CheckedCatalogue:
    catalogue: Catalogue
    columns: ColumnTypes
    mask_key: MaskKey | None
    digest: str  # the first 12 hex digits of the file's SHA-256: which file is being served
    # the database's leakproof comparison operators: which narrowings may go unfenced (leakproof.py)
    leakproof: LeakproofOperators = frozenset()


def unknown_handlers(catalogue: Catalogue, plugins: tuple[str, ...]) -> list[str]:
    """`dataset.layer: handler` for each layer whose handler is neither built in nor a declared
    plugin: a typo must stop the gateway, not start it to refuse every request of the dataset."""
    known = set(HANDLER_BINDS) | set(plugins)
    out: list[str] = []
    for entry in catalogue.datasets:
        for layer in ("person", "organization"):
            spec = getattr(entry.row_filters, layer)
            if spec is not None and spec.handler not in known:
                out.append(f"{entry.id}.{layer}: {spec.handler}")
    return out


def mask_key_for(settings: Settings, catalogue: Catalogue) -> MaskKey | None:
    """COLUMN_MASK_KEY, required when the catalogue masks any column by hash."""
    hashed = hash_masks(catalogue)
    if hashed and settings.column_mask_key is None:
        raise CatalogueRefused(f"COLUMN_MASK_KEY is required: dataset {hashed[0]} masks a column by hash")
    secret = settings.column_mask_key
    return MaskKey.of(secret.get_secret_value()) if secret is not None else None


def parse_catalogue(settings: Settings) -> tuple[Catalogue, str]:
    """The file read and validated without the database: schema and handler names."""
    path = settings.catalogue_path
    try:
        raw = Path(path).read_bytes()
        catalogue = Catalogue.model_validate(yaml.safe_load(raw))
    except (OSError, ValueError, yaml.YAMLError) as exc:  # ValidationError is a ValueError
        # a ValidationError's text names the field and the rule, never the input (ContractModel)
        raise CatalogueRefused(f"catalogue {path} refused: {exc}") from None
    unknown = unknown_handlers(catalogue, settings.row_filters_plugin_handlers)
    if unknown:
        raise CatalogueRefused(
            f"catalogue {path} refused: unknown row-filter handler ({'; '.join(unknown)}): neither "
            "built in nor listed in ROW_FILTERS_PLUGIN_HANDLERS"
        )
    return catalogue, hashlib.sha256(raw).hexdigest()[:12]


async def check_catalogue(settings: Settings, pool: asyncpg.Pool) -> CheckedCatalogue:
    """Every check, the database's columns included; raises CatalogueRefused naming the first
    failure."""
    catalogue, digest = parse_catalogue(settings)
    try:
        columns = await load_column_types(pool, catalogue)
        await check_records(pool, catalogue, columns)  # docs/records.md, the declaration
    except ValueError as exc:  # CatalogueMismatch (GS-09) names dataset, filter and column
        raise CatalogueRefused(f"catalogue refused: {exc}") from None
    leakproof = await load_leakproof_operators(pool)  # read with the columns: the same database
    return CheckedCatalogue(catalogue, columns, mask_key_for(settings, catalogue), digest, leakproof)
