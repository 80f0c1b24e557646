"""usage_records: one index for the per-tenant usage page and its CSV export

The page aggregates a tenant's rows over a time range and the export reads them in
(created_at, id) order: (tenant_id, created_at, id) serves both, the export without a sort
(so it can stream from a server-side cursor). On PostgreSQL the aggregated columns ride in
the index (INCLUDE), so the page is an index-only scan. It replaces ix_usage_tenant_created,
which it makes redundant: one index fewer to update on the insert-heavy table.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-10
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# The columns the usage page aggregates (laneway.db.usage_stats); keep in step with models.py.
INCLUDED = ["status", "error_code", "prompt_tokens", "completion_tokens", "ttft_ms"]


def upgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.create_index("ix_usage_tenant_created_id", ["tenant_id", "created_at", "id"], postgresql_include=INCLUDED)
        batch.drop_index("ix_usage_tenant_created")


def downgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.create_index("ix_usage_tenant_created", ["tenant_id", "created_at"])
        batch.drop_index("ix_usage_tenant_created_id")
