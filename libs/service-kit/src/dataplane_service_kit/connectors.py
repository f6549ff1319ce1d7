"""Connector resolution (docs/gateway.md, "Connector resolution"): which ds connector serves a
provider participant. One rule, run by the gateway and the audit-relay; the settings it reads
(ConnectorSettings) are the shared contract, this is the code that applies them."""

from __future__ import annotations

from dataplane_contracts.settings import ConnectorSettings


class UnroutableProvider(LookupError):
    """The provider is not served: listing any provider means listing all."""


class ConnectorNotConfigured(LookupError):
    """A default connector is needed but none is configured."""


def connector_base(settings: ConnectorSettings, participant: str | None) -> str:
    """The connector base URL for a provider participant (docs/gateway.md), trailing `/` stripped.

    Raises UnroutableProvider or ConnectorNotConfigured; never falls back to the default for a
    provider the map does not list."""
    if settings.connector_internal_urls and participant is not None:
        url = settings.connector_internal_urls.get(participant)
        if url is None:
            raise UnroutableProvider("provider not served")
        return str(url).rstrip("/")
    if settings.connector_internal_url is None:
        raise ConnectorNotConfigured("CONNECTOR_INTERNAL_URL is not configured")
    return str(settings.connector_internal_url).rstrip("/")
