"""The http-pull profile's refresh tokens: the hash of a flow's live refresh token.

Revision ID: 0002_refresh_tokens
Revises: 0001_flows
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002_refresh_tokens"
down_revision: str | None = "0001_flows"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # a SHA-256 hex digest, never the token; NULL whenever token_id is (retired together)
    op.add_column("dps_data_flows", sa.Column("refresh_hash", sa.String(64), nullable=True))
    op.create_unique_constraint("uq_dps_data_flows_refresh_hash", "dps_data_flows", ["refresh_hash"])


def downgrade() -> None:
    op.drop_constraint("uq_dps_data_flows_refresh_hash", "dps_data_flows", type_="unique")
    op.drop_column("dps_data_flows", "refresh_hash")
