"""docs/gateway.md, "Connector resolution": which connector serves a provider participant (shared by
the gateway and the audit-relay through `connector_base`)."""

from __future__ import annotations

import json

import pytest

from dataplane_contracts.settings import ConnectorSettings
from dataplane_service_kit.connectors import ConnectorNotConfigured, UnroutableProvider, connector_base

DEFAULT = "http://ds-default.example/"
A = "did:web:a.example"


def _settings(default: str | None, urls: dict[str, str]) -> ConnectorSettings:
    return ConnectorSettings(connector_internal_url=default, connector_internal_urls=json.dumps(urls))


@pytest.mark.parametrize("participant", [A, "did:web:anyone.example", None])
def test_ref_1_3_rule_1_empty_map_sends_everyone_to_the_default(participant: str | None) -> None:
    assert connector_base(_settings(DEFAULT, {}), participant) == "http://ds-default.example"


def test_ref_1_3_rule_2_listed_provider_gets_its_entry_trailing_slash_stripped() -> None:
    assert connector_base(_settings(DEFAULT, {A: "http://ds-a.example/"}), A) == "http://ds-a.example"


def test_ref_1_3_rule_2_unlisted_provider_never_falls_back_to_the_default() -> None:
    with pytest.raises(UnroutableProvider):
        connector_base(_settings(DEFAULT, {A: "http://ds-a.example"}), "did:web:other.example")


def test_ref_1_3_rule_3_no_participant_goes_to_the_default_even_with_a_map() -> None:
    settings = _settings(DEFAULT, {A: "http://ds-a.example"})
    assert connector_base(settings, None) == "http://ds-default.example"


def test_ref_1_3_rule_4_default_needed_but_unset() -> None:
    with pytest.raises(ConnectorNotConfigured):
        connector_base(_settings(None, {A: "http://ds-a.example"}), None)
    with pytest.raises(ConnectorNotConfigured):
        connector_base(_settings(None, {}), A)
