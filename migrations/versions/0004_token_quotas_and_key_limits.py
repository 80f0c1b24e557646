"""tenants: token quotas per UTC day and month; api_keys: their own rpm, tpm, max_concurrency
and model allow-list, enforced in addition to the tenant's

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(sa.Column("tokens_per_day", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("tokens_per_month", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("rpm", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("tpm", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("max_concurrency", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("allowed_models", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("allowed_models")
        batch.drop_column("max_concurrency")
        batch.drop_column("tpm")
        batch.drop_column("rpm")
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("tokens_per_month")
        batch.drop_column("tokens_per_day")
