"""lanes: background (batch work runs in the engine slots no foreground lane's request can
use now, and hands them back as its requests end)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Lanes from before are foreground, as they were scheduled until now.
    with op.batch_alter_table("lanes") as batch:
        batch.add_column(sa.Column("background", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("lanes") as batch:
        batch.drop_column("background")
