"""Tables of the Files and Batches API (migration 0011; db/batch_store.py reads and writes them).

Kept apart from models.py so the batch storage is one place; on the same Base, so Alembic and
the schema test see them once this module is imported (migrations/env.py imports it)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, LargeBinary, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from laneway.db.models import Base


class StoredFile(Base):
    """A file of the Files API: an uploaded batch input, or a batch's output or error file."""

    __tablename__ = "files"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # "file-" + 24 hex
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    purpose: Mapped[str] = mapped_column(String(20))  # batch (uploaded) | batch_output (laneway's)
    filename: Mapped[str] = mapped_column(String(255))
    size: Mapped[int] = mapped_column("bytes", BigInteger)  # column "bytes", as OpenAI names it
    # Deferred: a listing or a metadata read never pulls the (possibly large) content.
    content: Mapped[bytes] = mapped_column(LargeBinary, deferred=True)
    created_at: Mapped[datetime] = mapped_column()


class Batch(Base):
    __tablename__ = "batches"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # "batch_" + 24 hex
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    key_sha256: Mapped[str] = mapped_column(String(64))  # the API key the lines run as
    endpoint: Mapped[str] = mapped_column(String(40))
    # The one model every line names (as OpenAI requires): how much of it the runner keeps queued.
    model: Mapped[str] = mapped_column(String(200), default="", server_default="")
    input_file_id: Mapped[str] = mapped_column(String(40))
    completion_window: Mapped[str] = mapped_column(String(10))
    metadata_: Mapped[dict[str, Any] | None] = mapped_column("metadata", nullable=True)
    # validating | in_progress | finalizing | completed | failed | expired | cancelling | cancelled
    status: Mapped[str] = mapped_column(String(20))
    output_file_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    error_file_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    errors: Mapped[dict[str, Any] | None] = mapped_column(nullable=True)
    created_at: Mapped[datetime] = mapped_column()
    in_progress_at: Mapped[datetime | None] = mapped_column(nullable=True)
    finalizing_at: Mapped[datetime | None] = mapped_column(nullable=True)
    completed_at: Mapped[datetime | None] = mapped_column(nullable=True)
    failed_at: Mapped[datetime | None] = mapped_column(nullable=True)
    expired_at: Mapped[datetime | None] = mapped_column(nullable=True)
    cancelling_at: Mapped[datetime | None] = mapped_column(nullable=True)
    cancelled_at: Mapped[datetime | None] = mapped_column(nullable=True)
    expires_at: Mapped[datetime] = mapped_column()
    # A lease on finalizing: the replica writing the output files, until when (another takes
    # over a batch whose finalizer died once this passes).
    finalize_owner: Mapped[str | None] = mapped_column(String(64), nullable=True)
    finalize_until: Mapped[datetime | None] = mapped_column(nullable=True)

    __table_args__ = (
        Index("ix_batches_tenant_created", "tenant_id", "created_at"),
        # Every replica's runner looks for work by status each tick, over a table that keeps
        # every batch ever run: without it that is a full scan.
        Index("ix_batches_status", "status"),
    )


class BatchItem(Base):
    """One line of a batch's input file, and once run, its line of the output or error file."""

    __tablename__ = "batch_items"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    batch_id: Mapped[str] = mapped_column(ForeignKey("batches.id", ondelete="CASCADE"))
    line: Mapped[int] = mapped_column(Integer)  # 0-based position in the input file
    custom_id: Mapped[str] = mapped_column(String(512))
    tenant_id: Mapped[int] = mapped_column(Integer)  # the batch's, copied for fair claiming
    body: Mapped[str] = mapped_column(Text)  # the line's body, as JSON text
    # pending | running | succeeded | failed | expired | cancelled
    state: Mapped[str] = mapped_column(String(12))
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    lease_owner: Mapped[str | None] = mapped_column(String(64), nullable=True)
    lease_until: Mapped[datetime | None] = mapped_column(nullable=True)
    not_before: Mapped[datetime | None] = mapped_column(nullable=True)  # a retry's wait
    result: Mapped[str | None] = mapped_column(Text, nullable=True)  # its output/error line, set once
    finished_at: Mapped[datetime | None] = mapped_column(nullable=True)

    __table_args__ = (
        UniqueConstraint("batch_id", "custom_id", name="uq_batch_items_batch_custom"),
        # A claim reads one state's items of one batch in line order and stops at its limit.
        Index("ix_batch_items_batch_state_line", "batch_id", "state", "line"),
    )
