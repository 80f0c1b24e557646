"""lanes: TTFT and inter-token (TPOT) targets; tenants: the tightest TTFT target they may ask for

A lane's objectives in milliseconds (null: none); its queue timeout stays the hard bound. A
tenant's `min_ttft_target_ms` clamps the X-Laneway-TTFT-Target-Ms header the way
`priority_floor` clamps X-Laneway-Priority (null: it may not tighten its lanes' targets).

Plain ADD/DROP COLUMN, not batch mode: on SQLite a batch copy of `lanes` would drop the
config_version triggers migration 0013 put on it (SQLite 3.35+ drops a column in place).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("lanes", sa.Column("ttft_target_ms", sa.Integer(), nullable=True))
    op.add_column("lanes", sa.Column("tpot_target_ms", sa.Integer(), nullable=True))
    op.add_column("tenants", sa.Column("min_ttft_target_ms", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("tenants", "min_ttft_target_ms")
    op.drop_column("lanes", "tpot_target_ms")
    op.drop_column("lanes", "ttft_target_ms")
