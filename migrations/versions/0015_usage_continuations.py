"""usage_records: continuations (answers continued on another replica after theirs failed
mid-answer) and the prompt tokens those continuations prefilled

A continuation's prefill (the prompt and the answer so far, computed again on the next
replica) is laneway's own cost: recorded here, never billed to the tenant nor counted against
its TPM (core/pipeline/continuation.py). Rows from before: 0 and 0.

Plain ADD/DROP COLUMN, as 0014 (SQLite 3.35+ drops a column in place).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("usage_records", sa.Column("continuations", sa.Integer(), nullable=False, server_default="0"))
    op.add_column(
        "usage_records", sa.Column("continued_prompt_tokens", sa.Integer(), nullable=False, server_default="0")
    )


def downgrade() -> None:
    op.drop_column("usage_records", "continued_prompt_tokens")
    op.drop_column("usage_records", "continuations")
