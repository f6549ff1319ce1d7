"""Reading a service's Prometheus text (`/metrics`)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def _samples(text: str, name: str) -> Iterator[Sample]:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                yield s


def sample(text: str, name: str, **labels: str) -> float:
    """The first sample of `name` carrying these labels (others may be there too); 0.0 when there
    is none yet (a labelled counter appears on first use)."""
    for s in _samples(text, name):
        if all(s.labels.get(k) == v for k, v in labels.items()):
            return float(s.value)
    return 0.0


def series(text: str, name: str, **labels: str) -> float:
    """The sample of `name` with exactly these labels; 0.0 when that series does not exist yet."""
    for s in _samples(text, name):
        if s.labels == labels:
            return float(s.value)
    return 0.0


def total(text: str, name: str) -> float:
    """Every sample of `name` summed (a labelled counter over all its labels)."""
    return sum(float(s.value) for s in _samples(text, name))


async def scrape(client: httpx.AsyncClient, url: str = "/metrics") -> str:
    """The text a client's service serves at `url` (relative to the client's base URL, or whole)."""
    response = await client.get(url)
    assert response.status_code == 200
    return response.text
