"""usage_rollups (usage per minute, hour and day bucket), built from the rows already there;
on PostgreSQL usage_records becomes a table partitioned by day on created_at; api_keys gets a
(tenant_id, id) index for its pages

Rollups: one row per (width, tenant, bucket, key, model, lane, deployment, status, error code)
with the sums and a fixed-bucket TTFT histogram, and a tenant-totals tier (width_s negative:
tenant, model, status and error code only) (laneway.db.rollups,
docs/decisions/0012-usage-rollups.md). The backfill is one INSERT ... SELECT ... GROUP BY per
width, run by the database: no row passes through Python.

Partitions (PostgreSQL only; SQLite keeps one table and a retention DELETE): the table is
renamed, a partitioned twin created (LIKE: same columns, defaults and the same id sequence,
re-owned), one partition per day from the oldest row to a week ahead plus a DEFAULT partition
(a row past the days created ahead is kept, never refused), the rows copied, the old table
dropped. The primary key becomes (id, created_at): a partitioned table's unique keys must hold
its partition key. laneway creates the days ahead itself (laneway.db.usage_retention).
Downgrade copies the rows back into a plain table; neither direction loses a row.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

# Kept in step with laneway.db.rollups (written out here: a migration does not change with the code).
TTFT_BOUNDS_MS = tuple(round(4.0 * 1.35**i, 3) for i in range(31))
HIST_COLUMNS = tuple(f"ttft_b{i:02d}" for i in range(len(TTFT_BOUNDS_MS) + 1))
KEY_COLUMNS = ("width_s", "tenant_id", "bucket_s", "api_key_id", "model", "lane", "deployment", "status", "error_code")
WIDTHS = (60, 3600, 86400)
INCLUDED = ["status", "error_code", "prompt_tokens", "completion_tokens", "ttft_ms"]
AHEAD_DAYS = 7


def _hist_sql() -> list[str]:
    out = []
    for i in range(len(HIST_COLUMNS)):
        conds = []
        if i:
            conds.append(f"ttft_ms >= {TTFT_BOUNDS_MS[i - 1]}")
        if i < len(TTFT_BOUNDS_MS):
            conds.append(f"ttft_ms < {TTFT_BOUNDS_MS[i]}")
        out.append(f"SUM(CASE WHEN {' AND '.join(conds)} THEN 1 ELSE 0 END)")
    return out


def backfill(width: int, dialect: str) -> str:
    epoch = (
        "CAST(floor(extract(epoch FROM created_at)) AS BIGINT)"
        if dialect == "postgresql"
        else "CAST(strftime('%s', created_at) AS INTEGER)"
    )
    bucket = f"({epoch} - {epoch} % {width})"
    dims = (
        "COALESCE(tenant_id, 0), COALESCE(api_key_id, 0), model, COALESCE(lane, ''), COALESCE(deployment, ''), "
        "status, COALESCE(error_code, '')"
    )
    columns = ", ".join(
        [
            *KEY_COLUMNS,
            "requests",
            "prompt_tokens",
            "completion_tokens",
            "cost_micros",
            "ttft_n",
            "ttft_sum_ms",
            *HIST_COLUMNS,
        ]
    )
    return (
        f"INSERT INTO usage_rollups ({columns}) "
        f"SELECT {width}, COALESCE(tenant_id, 0), {bucket}, COALESCE(api_key_id, 0), model, COALESCE(lane, ''), "
        "COALESCE(deployment, ''), status, COALESCE(error_code, ''), COUNT(*), COALESCE(SUM(prompt_tokens), 0), "
        "COALESCE(SUM(completion_tokens), 0), COALESCE(SUM(cost_micros), 0), COUNT(ttft_ms), "
        "COALESCE(SUM(ttft_ms), 0), "
        f"{', '.join(_hist_sql())} FROM usage_records GROUP BY {dims}, {bucket}"
    )


def totals(width: int) -> str:
    """The tenant-totals tier (width_s = -width: tenant, model, status, code) of the detail
    buckets of one width."""
    sums = ", ".join(
        f"SUM({name})"
        for name in (
            "requests",
            "prompt_tokens",
            "completion_tokens",
            "cost_micros",
            "ttft_n",
            "ttft_sum_ms",
            *HIST_COLUMNS,
        )
    )
    columns = ", ".join(
        [
            *KEY_COLUMNS,
            "requests",
            "prompt_tokens",
            "completion_tokens",
            "cost_micros",
            "ttft_n",
            "ttft_sum_ms",
            *HIST_COLUMNS,
        ]
    )
    return (
        f"INSERT INTO usage_rollups ({columns}) "
        f"SELECT {-width}, tenant_id, bucket_s, 0, model, '', '', status, error_code, {sums} "
        f"FROM usage_rollups WHERE width_s = {width} GROUP BY tenant_id, bucket_s, model, status, error_code"
    )


def day_partition(day: datetime) -> str:
    following = day + timedelta(days=1)
    return (
        f"CREATE TABLE IF NOT EXISTS usage_records_p{day:%Y%m%d} PARTITION OF usage_records "
        f"FOR VALUES FROM ('{day:%Y-%m-%d} 00:00:00+00') TO ('{following:%Y-%m-%d} 00:00:00+00')"
    )


def partition(bind: sa.Connection) -> None:
    op.execute("ALTER TABLE usage_records RENAME TO usage_records_plain")
    op.execute("ALTER INDEX ix_usage_tenant_created_id RENAME TO ix_usage_plain_tenant_created_id")
    op.execute("ALTER TABLE usage_records_plain RENAME CONSTRAINT usage_records_pkey TO usage_records_plain_pkey")
    op.execute(
        "CREATE TABLE usage_records (LIKE usage_records_plain INCLUDING DEFAULTS) PARTITION BY RANGE (created_at)"
    )
    op.execute("ALTER SEQUENCE usage_records_id_seq OWNED BY usage_records.id")
    op.execute("ALTER TABLE usage_records ADD CONSTRAINT usage_records_pkey PRIMARY KEY (id, created_at)")
    op.create_index(
        "ix_usage_tenant_created_id", "usage_records", ["tenant_id", "created_at", "id"], postgresql_include=INCLUDED
    )
    oldest = bind.execute(sa.text("SELECT min(created_at) FROM usage_records_plain")).scalar()
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    day = (
        today
        if oldest is None
        else min(today, oldest.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0))
    )
    while day <= today + timedelta(days=AHEAD_DAYS):
        op.execute(day_partition(day))
        day += timedelta(days=1)
    op.execute("CREATE TABLE usage_records_pdefault PARTITION OF usage_records DEFAULT")
    op.execute("INSERT INTO usage_records SELECT * FROM usage_records_plain")
    op.execute("DROP TABLE usage_records_plain")


def unpartition() -> None:
    op.execute("ALTER TABLE usage_records RENAME TO usage_records_parted")
    op.execute("ALTER INDEX ix_usage_tenant_created_id RENAME TO ix_usage_parted_tenant_created_id")
    op.execute("ALTER TABLE usage_records_parted RENAME CONSTRAINT usage_records_pkey TO usage_records_parted_pkey")
    op.execute("CREATE TABLE usage_records (LIKE usage_records_parted INCLUDING DEFAULTS)")
    op.execute("ALTER SEQUENCE usage_records_id_seq OWNED BY usage_records.id")
    op.execute("INSERT INTO usage_records SELECT * FROM usage_records_parted")
    op.execute("ALTER TABLE usage_records ADD CONSTRAINT usage_records_pkey PRIMARY KEY (id)")
    op.create_index(
        "ix_usage_tenant_created_id", "usage_records", ["tenant_id", "created_at", "id"], postgresql_include=INCLUDED
    )
    op.execute("DROP TABLE usage_records_parted")  # its partitions with it


def upgrade() -> None:
    op.create_table(
        "usage_rollups",
        sa.Column("width_s", sa.Integer(), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("bucket_s", sa.BigInteger(), nullable=False),
        sa.Column("api_key_id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("lane", sa.String(length=60), nullable=False),
        sa.Column("deployment", sa.String(length=200), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("error_code", sa.String(length=60), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost_micros", sa.BigInteger(), nullable=False),
        sa.Column("ttft_n", sa.BigInteger(), nullable=False),
        sa.Column("ttft_sum_ms", sa.Float(), nullable=False),
        *(sa.Column(name, sa.BigInteger(), nullable=False) for name in HIST_COLUMNS),
        sa.PrimaryKeyConstraint(*KEY_COLUMNS, name="pk_usage_rollups"),
    )
    op.create_index("ix_usage_rollups_width_bucket", "usage_rollups", ["width_s", "bucket_s"])
    op.create_index("ix_api_keys_tenant_id_id", "api_keys", ["tenant_id", "id"])
    bind = op.get_bind()
    for width in WIDTHS:
        op.execute(backfill(width, bind.dialect.name))
        op.execute(totals(width))
    if bind.dialect.name == "postgresql":
        partition(bind)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        unpartition()
    op.drop_index("ix_api_keys_tenant_id_id", table_name="api_keys")
    op.drop_index("ix_usage_rollups_width_bucket", table_name="usage_rollups")
    op.drop_table("usage_rollups")
