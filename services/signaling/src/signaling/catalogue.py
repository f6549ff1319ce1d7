"""The catalogue as signaling reads it: only to freeze a flow's client range filters when the flow
starts (docs/records.md). The file is read again whenever it changed, so a start freezes the
declaration of that moment; a flow already started keeps what it was given."""

from __future__ import annotations

import os
import threading
from typing import Any

import yaml

from dataplane_contracts.catalogue import Catalogue, load_catalogue
from dataplane_contracts.records import START_METADATA_KEY, freeze
from dataplane_service_kit.errors import ServiceError
from dataplane_service_kit.logs import get_logger

log = get_logger(__name__)


class CatalogueSource:
    """`CATALOGUE_PATH`, loaded at start-up (a wrong file refuses the service) and again on the
    first start after it changed on disk (its size, inode or modification time)."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._catalogue: Catalogue = self._load()

    def _signature(self) -> tuple[int, int, int]:
        st = os.stat(self._path)
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _load(self) -> Catalogue:
        stamp = self._signature()
        catalogue = load_catalogue(self._path)
        self._stamp = stamp
        return catalogue

    def current(self) -> Catalogue:
        """The catalogue as the file is now. A file that cannot be read or is invalid refuses
        the start that needs it (503), never a freeze from an older declaration."""
        with self._lock:
            try:
                if self._signature() != self._stamp:
                    self._catalogue = self._load()
            except (OSError, ValueError, yaml.YAMLError) as exc:
                log.warning("catalogue_unreadable", error=type(exc).__name__)
                raise ServiceError("not_ready", "the catalogue cannot be read now") from None
            return self._catalogue


def asks_for_filters(metadata: dict[str, Any]) -> bool:
    """Whether a start asks for a frozen set: `true` yes; `false` or absent no; any other value
    is refused (422 invalid_message)."""
    value = metadata.get(START_METADATA_KEY, False)
    if not isinstance(value, bool):
        raise ServiceError("invalid_message", f"metadata.{START_METADATA_KEY} must be a boolean")
    return value


def frozen_extensions(
    source: CatalogueSource | None, dataset_id: str, metadata: dict[str, Any]
) -> dict[str, Any] | None:
    """The grant extensions a start records for its flow: the dataset's range filters as the
    catalogue declares them now, when the start asks for them; None otherwise. Without a
    catalogue this data plane offers no range filters, and a start asking for them is refused."""
    if not asks_for_filters(metadata):
        return None
    if source is None:
        raise ServiceError("invalid_message", "this data plane offers no client range filters")
    entry = source.current().by_id().get(dataset_id)
    return freeze(dataset_id, entry.records if entry is not None else None)
