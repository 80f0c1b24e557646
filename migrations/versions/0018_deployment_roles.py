"""deployments: role (serving | canary | shadow), weight and sample (percent, 0-100)

An alias's deployments play a role: `serving` (the incumbent pool, every row before this
one), `canary` (takes `weight` percent of the alias's sessions, sticky per tenant and session:
core/canary/pools.py) or `shadow` (takes no client's request; `sample` percent of the live
requests are copied to it in the background and its answers compared: core/canary/shadow.py).

Plain ADD/DROP COLUMN, as 0015 (SQLite 3.35+ drops a column in place): no table copy, so the
config_version triggers of 0013 on deployments stay, and a role change moves the counter like
any other edit of the table (every replica reloads it).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("deployments", sa.Column("role", sa.String(20), nullable=False, server_default="serving"))
    op.add_column("deployments", sa.Column("weight", sa.Float(), nullable=False, server_default="0"))
    op.add_column("deployments", sa.Column("sample", sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("deployments", "sample")
    op.drop_column("deployments", "weight")
    op.drop_column("deployments", "role")
