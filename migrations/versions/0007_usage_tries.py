"""usage_records: how many replicas a request tried, which failed it before its first byte
(failover), and the fallback alias that served it

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.add_column(sa.Column("tries", sa.Integer(), nullable=False, server_default="1"))
        batch.add_column(sa.Column("failed_deployments", sa.String(400), nullable=True))
        batch.add_column(sa.Column("served_model", sa.String(200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_column("served_model")
        batch.drop_column("failed_deployments")
        batch.drop_column("tries")
