"""tenants: the lanes a tenant may ask for explicitly, and the highest priority it may request

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(sa.Column("allowed_lanes", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("priority_floor", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("priority_floor")
        batch.drop_column("allowed_lanes")
