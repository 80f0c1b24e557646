"""models: a price per alias (input, output and cached input, in micro-units of the currency
per 1M tokens); usage_records: each request's cost in micro-units; tenants and api_keys: money
budgets per UTC day and month in micro-units

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Aliases from before: not priced (null) until an admin sets a price; their rows: no cost.
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("price_input", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("price_output", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("price_cached_input", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("usage_records") as batch:
        batch.add_column(sa.Column("cost_micros", sa.BigInteger(), nullable=True))
    for table in ("tenants", "api_keys"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("budget_per_day", sa.BigInteger(), nullable=True))
            batch.add_column(sa.Column("budget_per_month", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    for table in ("api_keys", "tenants"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("budget_per_month")
            batch.drop_column("budget_per_day")
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_column("cost_micros")
    with op.batch_alter_table("models") as batch:
        batch.drop_column("price_cached_input")
        batch.drop_column("price_output")
        batch.drop_column("price_input")
