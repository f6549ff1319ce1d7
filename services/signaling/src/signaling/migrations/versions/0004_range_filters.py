"""The records API: a flow's grant extensions (the client range-filter set frozen when it started,
docs/records.md), stored with the flow and shown by the pull-grant view.

Revision ID: 0004_range_filters
Revises: 0003_token_rotation
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004_range_filters"
down_revision: str | None = "0003_token_rotation"
branch_labels: str | None = None
depends_on: str | None = None

VIEW = "dps_pull_grants"  # dataplane_contracts.dps.PULL_GRANT_VIEW (a published contract)
_BEFORE = "id AS flow_id, state, agreement_id, dataset_id, participant_id, counter_party_id"
# the view's new column goes last: CREATE OR REPLACE VIEW may only append, and keeps the grants
_COLUMNS = _BEFORE + ", grant_extensions::text AS grant_extensions"


def _view(columns: str) -> str:
    return (
        f"CREATE OR REPLACE VIEW {VIEW} AS "
        f"SELECT token_id, {columns} FROM dps_data_flows WHERE token_id IS NOT NULL "
        f"UNION ALL SELECT pending_token_id, {columns} FROM dps_data_flows WHERE pending_token_id IS NOT NULL"
    )


def upgrade() -> None:
    # written once, by the start that issues the flow's first token; never updated afterwards
    op.add_column("dps_data_flows", sa.Column("grant_extensions", sa.JSON, nullable=True))
    op.execute(_view(_COLUMNS))


def downgrade() -> None:
    # a view cannot lose a column by replacement: dropped (its grants with it) and made again
    role = op.get_context().config.attributes["pull_grant_role"]  # type: ignore[union-attr]
    op.execute(f"DROP VIEW {VIEW}")
    op.execute(_view(_BEFORE))
    op.execute(f'GRANT SELECT ON {VIEW} TO "{role.replace(chr(34), chr(34) * 2)}"')
    op.drop_column("dps_data_flows", "grant_extensions")
