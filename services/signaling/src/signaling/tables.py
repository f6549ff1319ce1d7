"""The flows database as SQLAlchemy Core tables (the schema itself comes only from migrations).

No column can hold a credential: no token (only its id), no authorization profile, and data
addresses are stored after `DataAddress.without_credentials()`."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    Uuid,
)
from sqlalchemy.dialects.postgresql import JSONB

metadata = MetaData()

data_flows = Table(
    "dps_data_flows",
    metadata,
    Column("id", String(255), primary_key=True),
    Column("role", String(16), nullable=False),
    Column("state", String(16), nullable=False),
    Column("caller", String(255), nullable=False),
    Column("participant_id", String(1024), nullable=False),
    Column("counter_party_id", String(1024), nullable=False),
    Column("agreement_id", String(255), nullable=False),
    Column("dataset_id", String(255), nullable=False),
    Column("transfer_type", String(512), nullable=False),
    Column("dataspace_context", String(255), nullable=True),
    Column("callback_address", Text, nullable=True),
    Column("claims", JSON, nullable=False),
    Column("labels", JSON, nullable=False),
    Column("metadata", JSON, nullable=False),
    Column("data_address", JSON, nullable=True),
    Column("token_id", String(64), nullable=True, unique=True),
    Column("refresh_hash", String(64), nullable=True, unique=True),  # http-pull: a digest only
    # a renewal's new pair until its first use (migration 0003)
    Column("pending_token_id", String(64), nullable=True, unique=True),
    Column("pending_refresh_hash", String(64), nullable=True, unique=True),
    # the client range-filter set frozen at the start (migration 0004, docs/records.md)
    Column("grant_extensions", JSON(none_as_null=True), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

client_jtis = Table(
    "dps_client_jtis",
    metadata,
    Column("issuer", String(1024), primary_key=True),
    Column("jti", String(255), primary_key=True),
    Column("expires_at", DateTime(timezone=True), nullable=False),
)

control_planes = Table(
    "dps_control_planes",
    metadata,
    Column("controlplane_id", String(255), primary_key=True),
    Column("endpoint", Text, nullable=False),
    Column("registered_by", String(255), nullable=False, index=True),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

outbox = Table(
    "dps_outbox",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("event_id", Uuid, nullable=False, unique=True),
    Column("topic", String(255), nullable=False),
    Column("key", String(255), nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("headers", JSONB, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("sent_at", DateTime(timezone=True), nullable=True),
)

# the DPS-12 callbacks an asynchronous prepare or start owes (migration 0005); no credential: the
# message is built when it is sent
callbacks = Table(
    "dps_callbacks",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("flow_id", String(255), ForeignKey("dps_data_flows.id", ondelete="CASCADE"), nullable=False),
    Column("action", String(16), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("next_attempt_at", DateTime(timezone=True), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    Column("outcome", String(16), nullable=True),
    Column("last_error", String(255), nullable=True),
)
