"""Data flows, control-plane registrations, the outbox and the pull-grant view.

Revision ID: 0001_flows
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0001_flows"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

VIEW = "dps_pull_grants"  # dataplane_contracts.dps.PULL_GRANT_VIEW (a published contract)


def _role() -> str:
    role: str = op.get_context().config.attributes["pull_grant_role"]  # type: ignore[union-attr]
    return role


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _require_role(role: str) -> None:
    # Roles are cluster-wide and owned by the operator: migrations only grant and revoke.
    exists = op.get_bind().execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first()
    if exists is None:
        raise RuntimeError(
            f"the pull-grant role {role!r} (DPS_PULL_GRANT_ROLE) does not exist; "
            f"create it first, e.g. CREATE ROLE {_quoted(role)} NOLOGIN"
        )


def upgrade() -> None:
    role = _role()
    _require_role(role)
    op.create_table(
        "dps_data_flows",
        sa.Column("id", sa.String(255), primary_key=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("caller", sa.String(255), nullable=False),
        sa.Column("participant_id", sa.String(1024), nullable=False),
        sa.Column("counter_party_id", sa.String(1024), nullable=False),
        sa.Column("agreement_id", sa.String(255), nullable=False),
        sa.Column("dataset_id", sa.String(255), nullable=False),
        sa.Column("transfer_type", sa.String(512), nullable=False),
        sa.Column("dataspace_context", sa.String(255), nullable=True),
        sa.Column("callback_address", sa.Text(), nullable=True),
        sa.Column("claims", sa.JSON(), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("data_address", sa.JSON(), nullable=True),
        sa.Column("token_id", sa.String(64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("token_id", name="uq_dps_data_flows_token_id"),
    )
    op.create_index("ix_dps_data_flows_caller", "dps_data_flows", ["caller"])
    op.create_table(
        "dps_control_planes",
        sa.Column("controlplane_id", sa.String(255), primary_key=True),
        sa.Column("endpoint", sa.Text(), nullable=False),
        sa.Column("registered_by", sa.String(255), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_dps_control_planes_registered_by", "dps_control_planes", ["registered_by"])
    op.create_table(
        "dps_outbox",
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.Uuid(), nullable=False, unique=True),
        sa.Column("topic", sa.String(255), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("payload", sa.dialects.postgresql.JSONB(), nullable=False),
        sa.Column("headers", sa.dialects.postgresql.JSONB(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
    )
    # the relay only ever scans unsent rows, by flow (oldest unsent row per flow first)
    op.create_index(
        "ix_dps_outbox_unsent", "dps_outbox", ["key", "id"], postgresql_where=sa.text("sent_at IS NULL")
    )
    # Only live tokens appear: a retired token's flow has token_id NULL, so its row is gone the
    # moment the retiring transaction commits.
    op.execute(
        f"CREATE VIEW {VIEW} AS SELECT token_id, id AS flow_id, state, agreement_id, dataset_id, "
        "participant_id, counter_party_id FROM dps_data_flows WHERE token_id IS NOT NULL"
    )
    op.execute(f"GRANT SELECT ON {VIEW} TO {_quoted(role)}")


def downgrade() -> None:
    role = _role()
    exists = op.get_bind().execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first()
    if exists is not None:
        op.execute(f"REVOKE ALL ON {VIEW} FROM {_quoted(role)}")
    op.execute(f"DROP VIEW IF EXISTS {VIEW}")
    op.drop_index("ix_dps_outbox_unsent", table_name="dps_outbox")
    op.drop_table("dps_outbox")
    op.drop_index("ix_dps_control_planes_registered_by", table_name="dps_control_planes")
    op.drop_table("dps_control_planes")
    op.drop_index("ix_dps_data_flows_caller", table_name="dps_data_flows")
    op.drop_table("dps_data_flows")
