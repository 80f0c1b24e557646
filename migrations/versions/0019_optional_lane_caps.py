"""lanes: max_concurrency optional (null: no cap; each replica's learned running limit rules)

A lane's cap on its running sequences per deployment becomes a policy ceiling an operator may
set, not a count every lane must have (issue 38): the shipped lanes no longer set one. Rows
that have a cap keep it; `laneway lane set NAME --max-concurrency none` clears one.

SQLite cannot drop a NOT NULL in place: batch mode copies the table, which drops the
config_version triggers migration 0013 put on it, so they are made again here.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

EVENTS = ("insert", "update", "delete")


def _sqlite_triggers(create: bool) -> None:
    for event in EVENTS:
        op.execute(f"DROP TRIGGER IF EXISTS lanes_config_version_{event}")
        if create:
            op.execute(
                f"CREATE TRIGGER lanes_config_version_{event} AFTER {event.upper()} ON lanes "
                "BEGIN UPDATE config_version SET version = version + 1; END"
            )


def _nullable(nullable: bool) -> None:
    if op.get_bind().dialect.name == "sqlite":
        _sqlite_triggers(create=False)
        with op.batch_alter_table("lanes") as batch:
            batch.alter_column("max_concurrency", existing_type=sa.Integer(), nullable=nullable)
        _sqlite_triggers(create=True)
    else:  # PostgreSQL alters in place: its statement trigger stays
        op.alter_column("lanes", "max_concurrency", existing_type=sa.Integer(), nullable=nullable)


def upgrade() -> None:
    _nullable(True)


def downgrade() -> None:
    # A lane without a cap gets the cap the shipped lanes had before (4).
    op.execute("UPDATE lanes SET max_concurrency = 4 WHERE max_concurrency IS NULL")
    _nullable(False)
