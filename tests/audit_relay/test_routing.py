"""Connector resolution (docs/gateway.md) on the relay, with both CONNECTOR_INTERNAL_URL (a default
connector) and CONNECTOR_INTERNAL_URLS (providers A and B) set: a listed provider goes to its own
connector; a provider the map does not list is unroutable (listing any means listing all) and is never sent to
the default; an event that names no provider goes to the default (rule 3)."""

from __future__ import annotations

from dataplane_testing import audit_relay as h


async def test_ref_1_3_rule_2_unlisted_provider_is_unroutable_and_never_sent_to_the_default(
    harness: h.Harness,
) -> None:
    unlisted = h.event(h.UNROUTABLE)
    behind = h.event(h.PROVIDER_A)  # on the same partition, after it: still delivered
    await harness.publish([unlisted, behind], key=h.PROVIDER_A)

    letters = await harness.wait_dead_letters([unlisted["event_id"]])
    assert letters[unlisted["event_id"]]["reason"] == "unroutable"
    await harness.wait_accepted([behind])
    for connector in (harness.default, harness.a, harness.b):
        assert connector.audit_calls([unlisted["event_id"]]) == []
    # nor anything else reached the default: it serves only events that name no provider
    assert harness.default.audit_calls([behind["event_id"]]) == []
    assert harness.a.accepted_ids([behind["event_id"]]) == [behind["event_id"]]


async def test_ref_1_3_rule_3_event_naming_no_provider_goes_to_the_default_connector(
    harness: h.Harness,
) -> None:
    anonymous = h.event(h.PROVIDER_A, provider_participant=None)
    named = h.event(h.PROVIDER_B)
    await harness.publish([anonymous, named], key="no-provider")
    await harness.wait_accepted([anonymous, named])

    (call,) = harness.default.audit_calls([anonymous["event_id"]])
    assert call.status == 200
    assert call.body["dataset_id"] == anonymous["dataset_id"]
    assert call.headers["authorization"].startswith("Bearer ")
    assert harness.a.audit_calls([anonymous["event_id"]]) == []
    assert harness.b.audit_calls([anonymous["event_id"]]) == []
    # the provider named on the same partition still goes to its own connector, not the default
    assert harness.b.accepted_ids([named["event_id"]]) == [named["event_id"]]
    assert harness.default.audit_calls([named["event_id"]]) == []
