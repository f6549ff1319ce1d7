"""Configuration of the audit-relay (docs/configuration.md), validated at start-up."""

from __future__ import annotations

from pydantic import Field, model_validator

from dataplane_contracts.settings import (
    ConnectorSettings,
    HttpSettings,
    KafkaSettings,
    OidcSettings,
    OutboundTlsSettings,
)
from dataplane_contracts.topics import AUDIT_DISCLOSURES, AUDIT_DISCLOSURES_DLQ
from dataplane_service_kit.outbound_tls import proxy_for


class Settings(HttpSettings, KafkaSettings, OidcSettings, ConnectorSettings, OutboundTlsSettings):
    http_port: int = Field(default=8003, ge=1, le=65535)

    # The topics and group default to the contracts' names; overriding them lets a test (or a
    # shared cluster) run an isolated relay without touching anyone else's disclosures.
    audit_relay_group_id: str = Field(default="dataplane-audit-relay", min_length=1)
    audit_relay_topic: str = Field(default=AUDIT_DISCLOSURES, min_length=1)
    audit_relay_dlq_topic: str = Field(default=AUDIT_DISCLOSURES_DLQ, min_length=1)

    # readiness fails once the broker or ds has been unreachable for longer than this
    audit_relay_unready_grace_s: float = Field(default=30.0, ge=0)
    audit_relay_backoff_initial_s: float = Field(default=0.5, gt=0)
    # the longest backoff, and so how long after ds recovers a partition may wait for its next
    # probe (the backoff is half fixed, half random: between half of this and this); an outage
    # costs one post per backoff per partition, little for ds even at a few seconds
    audit_relay_backoff_max_s: float = Field(default=5.0, gt=0)
    # a Retry-After beyond this is treated as this (a broken header must not park a partition for days)
    audit_relay_retry_after_max_s: float = Field(default=300.0, gt=0)
    # docs/wire-contracts.md: every connector call has a 5 s timeout
    audit_relay_http_timeout_s: float = Field(default=5.0, gt=0)
    audit_relay_session_timeout_ms: int = Field(default=10_000, ge=1_000)
    # how often the broker is probed and the per-partition lag gauge refreshed
    audit_relay_monitor_interval_s: float = Field(default=5.0, gt=0)
    # Posts of one partition in flight at once, and how far ahead of its oldest unfinished record
    # a partition may send (window.py). 1 keeps ds seeing each partition strictly in order, at one
    # round trip per record; the default covers the round trip at the relay's target rate.
    audit_relay_max_in_flight_per_partition: int = Field(default=32, ge=1, le=1024)
    # Posts to one connector in flight at once, over all partitions: the size of that connector's
    # keep-alive pool, so one busy ds neither gets more than this nor starves the others.
    audit_relay_max_in_flight_per_connector: int = Field(default=64, ge=1, le=1024)
    # Records of one partition fetched and not yet delivered or dead-lettered; fetching of the
    # partition pauses at this many (back-pressure), and resumes once half of them are done.
    # 4096: a broker that sleeps out its fetch wait (Tansu: 500 ms in the local stack) hands over
    # at most this many per wait, and 2 000 events/s needs more than 1 000 per wait (~4 MB at
    # ~1 KB per record)
    audit_relay_max_buffered_per_partition: int = Field(default=4096, ge=1, le=100_000)
    # RF-10: how long a fetch must keep jumping past the same offset (fetched again each time)
    # before the relay takes the jump as the broker's own hole. A broker under concurrent
    # producers can show a later batch before an earlier one (the local broker does, about once
    # in ten thousand records, for a few milliseconds); a jump seen twice in a row is not yet
    # a hole. Our producers write no transaction markers and the audit topic is not compacted,
    # so on a correct broker this wait never happens
    audit_relay_broker_hole_confirm_s: float = Field(default=5.0, ge=0)

    @model_validator(mode="after")
    def _complete(self) -> Settings:
        if self.connector_internal_url is None and not self.connector_internal_urls:
            raise ValueError("CONNECTOR_INTERNAL_URL or CONNECTOR_INTERNAL_URLS is required")
        if self.celine_oidc_client_id:
            if self.celine_oidc_base_url is None:
                raise ValueError("CELINE_OIDC_BASE_URL is required with CELINE_OIDC_CLIENT_ID")
            if self.celine_oidc_client_secret is None:
                raise ValueError("CELINE_OIDC_CLIENT_SECRET is required with CELINE_OIDC_CLIENT_ID")
        for url in [self.connector_internal_url, *self.connector_internal_urls.values()]:
            # the relay's own client takes only an http:// proxy (audit_relay.http1): any other
            # proxy variable for a connector's scheme stops the start rather than every post
            if url is not None and url.host:
                proxy_for(url.scheme, url.host)
        if self.audit_relay_backoff_max_s < self.audit_relay_backoff_initial_s:
            raise ValueError("AUDIT_RELAY_BACKOFF_MAX_S must not be below AUDIT_RELAY_BACKOFF_INITIAL_S")
        if self.audit_relay_max_buffered_per_partition < self.audit_relay_max_in_flight_per_partition:
            # the window could never fill: what is in flight has to be buffered first
            raise ValueError(
                "AUDIT_RELAY_MAX_BUFFERED_PER_PARTITION must not be below "
                "AUDIT_RELAY_MAX_IN_FLIGHT_PER_PARTITION"
            )
        return self
