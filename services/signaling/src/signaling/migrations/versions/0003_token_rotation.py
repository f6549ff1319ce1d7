"""http-pull token renewal: the pending pair of a rotation, the client-JWT ids seen (replays), the
pull-grant view over both pairs, and the function the gateway calls on a token's first use.

Revision ID: 0003_token_rotation
Revises: 0002_refresh_tokens
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003_token_rotation"
down_revision: str | None = "0002_refresh_tokens"
branch_labels: str | None = None
depends_on: str | None = None

VIEW = "dps_pull_grants"  # dataplane_contracts.dps.PULL_GRANT_VIEW (a published contract)
USED = "dps_pull_token_used"  # dataplane_contracts.dps.PULL_TOKEN_USED_FUNCTION
_COLUMNS = "id AS flow_id, state, agreement_id, dataset_id, participant_id, counter_party_id"


def _role() -> str:
    role: str = op.get_context().config.attributes["pull_grant_role"]  # type: ignore[union-attr]
    return role


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def upgrade() -> None:
    role = _quoted(_role())
    # a renewal's new pair waits here until its access token is first used (or its refresh token
    # presented); then it replaces the current pair and the old one is dead
    op.add_column("dps_data_flows", sa.Column("pending_token_id", sa.String(64), nullable=True))
    op.add_column("dps_data_flows", sa.Column("pending_refresh_hash", sa.String(64), nullable=True))
    op.create_unique_constraint("uq_dps_data_flows_pending_token_id", "dps_data_flows", ["pending_token_id"])
    op.create_unique_constraint(
        "uq_dps_data_flows_pending_refresh_hash", "dps_data_flows", ["pending_refresh_hash"]
    )
    # the `jti` of every client JWT accepted for a renewal, until it expires: a replay is refused
    op.create_table(
        "dps_client_jtis",
        sa.Column("issuer", sa.String(1024), nullable=False),
        sa.Column("jti", sa.String(255), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("issuer", "jti", name="pk_dps_client_jtis"),
    )
    op.create_index("ix_dps_client_jtis_expires_at", "dps_client_jtis", ["expires_at"])
    # the same seven columns: a pending access token is live as well as the current one
    op.execute(
        f"CREATE OR REPLACE VIEW {VIEW} AS "
        f"SELECT token_id, {_COLUMNS} FROM dps_data_flows WHERE token_id IS NOT NULL "
        f"UNION ALL SELECT pending_token_id, {_COLUMNS} FROM dps_data_flows WHERE pending_token_id IS NOT NULL"
    )
    # the gateway's one write, as the table owner: a pending token's first use makes its pair the
    # current one (a no-op for any other token). The read role may execute it and nothing else
    op.execute(
        f"CREATE FUNCTION {USED}(used_token_id text) RETURNS void LANGUAGE sql SECURITY DEFINER "
        "SET search_path = pg_catalog, public AS $$ "
        "UPDATE dps_data_flows SET token_id = pending_token_id, refresh_hash = pending_refresh_hash, "
        "pending_token_id = NULL, pending_refresh_hash = NULL, updated_at = now() "
        "WHERE pending_token_id = used_token_id AND state = 'STARTED' $$"
    )
    op.execute(f"REVOKE ALL ON FUNCTION {USED}(text) FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION {USED}(text) TO {role}")


def downgrade() -> None:
    op.execute(f"DROP FUNCTION IF EXISTS {USED}(text)")
    op.execute(
        f"CREATE OR REPLACE VIEW {VIEW} AS "
        f"SELECT token_id, {_COLUMNS} FROM dps_data_flows WHERE token_id IS NOT NULL"
    )
    op.drop_index("ix_dps_client_jtis_expires_at", table_name="dps_client_jtis")
    op.drop_table("dps_client_jtis")
    op.drop_constraint("uq_dps_data_flows_pending_refresh_hash", "dps_data_flows", type_="unique")
    op.drop_constraint("uq_dps_data_flows_pending_token_id", "dps_data_flows", type_="unique")
    op.drop_column("dps_data_flows", "pending_refresh_hash")
    op.drop_column("dps_data_flows", "pending_token_id")
