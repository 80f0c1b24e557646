"""admins.role (owner | operator | viewer), and the customer portal's tables: portal_users,
portal_sessions, portal_key_caps

Every admin from before is an owner (the server default fills the new column), so nobody
loses what it could do; new admins are given a role when they are created (admin/roles.py).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
# 0016 is reserved for another branch; whichever merges second points here at the other.
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("admins", sa.Column("role", sa.String(length=20), nullable=False, server_default="owner"))
    op.create_table(
        "portal_users",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("username", sa.String(length=120), nullable=False),
        sa.Column("password_hash", sa.String(length=200), nullable=False),
        sa.Column("role", sa.String(length=20), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_login_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("username"),
    )
    op.create_index("ix_portal_users_tenant_id", "portal_users", ["tenant_id"], unique=False)
    op.create_table(
        "portal_sessions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("token_sha256", sa.String(length=64), nullable=False),
        sa.Column("csrf_token", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["user_id"], ["portal_users.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_sha256"),
    )
    op.create_index("ix_portal_sessions_user_id", "portal_sessions", ["user_id"], unique=False)
    op.create_table(
        "portal_key_caps",
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("max_keys", sa.Integer(), nullable=False),
        sa.Column("allowed_models", sa.JSON(), nullable=True),
        sa.Column("max_rpm", sa.Integer(), nullable=True),
        sa.Column("max_tpm", sa.Integer(), nullable=True),
        sa.Column("max_concurrency", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("tenant_id"),
    )


def downgrade() -> None:
    op.drop_table("portal_key_caps")
    op.drop_index("ix_portal_sessions_user_id", table_name="portal_sessions")
    op.drop_table("portal_sessions")
    op.drop_index("ix_portal_users_tenant_id", table_name="portal_users")
    op.drop_table("portal_users")
    op.drop_column("admins", "role")
