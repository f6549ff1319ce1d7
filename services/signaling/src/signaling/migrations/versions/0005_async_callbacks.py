"""Asynchronous signals: the callbacks a prepare or start answered with 202 owes the control plane.

A row is written in the same transaction as the flow it announces (PREPARING / STARTING), so a
signaling process that dies after its 202 leaves the row for whichever replica runs next. It holds
no credential: the message, data address included, is built when the callback is sent.

Revision ID: 0005_async_callbacks
Revises: 0004_range_filters
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005_async_callbacks"
down_revision: str | None = "0004_range_filters"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "dps_callbacks",
        sa.Column("id", sa.BigInteger, sa.Identity(), nullable=False),
        sa.Column("flow_id", sa.String(255), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        # the next attempt is due then; a claimed row is pushed forward first (a lease: a process
        # dying mid-delivery leaves it due again after its backoff)
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        # set once the control plane accepted it, or it was dropped (the flow moved on)
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.String(16), nullable=True),
        # why the last attempt failed: a status code or an exception class, never a body
        sa.Column("last_error", sa.String(255), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_dps_callbacks"),
        sa.ForeignKeyConstraint(
            ["flow_id"], ["dps_data_flows.id"], name="fk_dps_callbacks_flow", ondelete="CASCADE"
        ),
    )
    op.create_index(
        "ix_dps_callbacks_due",
        "dps_callbacks",
        ["next_attempt_at"],
        postgresql_where=sa.text("finished_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_dps_callbacks_due", table_name="dps_callbacks")
    op.drop_table("dps_callbacks")
