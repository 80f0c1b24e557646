"""config_version: one row whose counter moves on every change to what a replica's
configuration is read from (models, deployments, lanes, task_policies), kept by triggers

Each replica polls this one value and reloads its policies and engines only when it moved,
instead of reading the four tables every poll (runtime/config_poll.py). Triggers keep it, so a
change made by any writer (the admin API, the CLI, another replica, SQL by hand) moves it.

On SQLite a later migration that alters one of these tables in batch mode (a copy of the table)
drops its triggers with the old table: it must create them again (create_triggers below).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

TABLES = ("models", "deployments", "lanes", "task_policies")
EVENTS = ("insert", "update", "delete")
FUNCTION = "laneway_bump_config_version"

# The schema of the table that changed, not the search_path of whoever changed it: a table
# and its counter always move together.
PG_FUNCTION = f"""
CREATE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('UPDATE %I.config_version SET version = version + 1', TG_TABLE_SCHEMA);
    RETURN NULL;
END
$$
"""


def create_triggers(table: str) -> None:
    if op.get_bind().dialect.name == "postgresql":
        # Once per statement: an import that writes a hundred rows moves the counter once.
        op.execute(
            f"CREATE TRIGGER {table}_config_version AFTER INSERT OR UPDATE OR DELETE ON {table} "
            f"FOR EACH STATEMENT EXECUTE PROCEDURE {FUNCTION}()"
        )
        return
    for event in EVENTS:  # SQLite has one event per trigger, and row triggers only
        op.execute(
            f"CREATE TRIGGER {table}_config_version_{event} AFTER {event.upper()} ON {table} "
            "BEGIN UPDATE config_version SET version = version + 1; END"
        )


def drop_triggers(table: str) -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP TRIGGER IF EXISTS {table}_config_version ON {table}")
        return
    for event in EVENTS:
        op.execute(f"DROP TRIGGER IF EXISTS {table}_config_version_{event}")


def upgrade() -> None:
    version = op.create_table(
        "config_version",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.bulk_insert(version, [{"id": 1, "version": 1}])
    if op.get_bind().dialect.name == "postgresql":
        op.execute(PG_FUNCTION)
    for table in TABLES:
        create_triggers(table)


def downgrade() -> None:
    for table in TABLES:
        drop_triggers(table)
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP FUNCTION IF EXISTS {FUNCTION}()")
    op.drop_table("config_version")
