"""task_policies: early stops (the repetition rule's n-gram and count, the JSON modes' stop at
the end of the value); usage_records: the early stop that ended a request's decoding

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Rows from before: repetition off (null) until an admin or `laneway import-policies` sets it.
    with op.batch_alter_table("task_policies") as batch:
        batch.add_column(sa.Column("repetition_ngram", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("repetition_count", sa.Integer(), nullable=False, server_default="3"))
        batch.add_column(sa.Column("json_stop", sa.Boolean(), nullable=False, server_default=sa.true()))
    with op.batch_alter_table("usage_records") as batch:
        batch.add_column(sa.Column("early_stop", sa.String(20), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_column("early_stop")
    with op.batch_alter_table("task_policies") as batch:
        batch.drop_column("json_stop")
        batch.drop_column("repetition_count")
        batch.drop_column("repetition_ngram")
