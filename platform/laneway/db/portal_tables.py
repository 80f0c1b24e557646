"""Tables of the customer portal (migration 0017; db/portal_repositories.py reads and writes them):
a tenant's own users, their sessions, and the caps its operator sets on the keys they issue.

Kept apart from models.py so the portal's storage is one place; on the same Base, so Alembic and
the schema test see them once this module is imported (migrations/env.py imports it)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column, relationship

from laneway.db.models import Base, Tenant, utcnow

TENANT_OWNER = "tenant-owner"
TENANT_MEMBER = "tenant-member"
PORTAL_ROLES = (TENANT_OWNER, TENANT_MEMBER)
# Without a caps row a tenant's users may hold this many live keys, each within the tenant's limits.
DEFAULT_MAX_KEYS = 5


class PortalUser(Base):
    """A tenant's own user: signs in at /portal and sees its tenant only."""

    __tablename__ = "portal_users"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    username: Mapped[str] = mapped_column(String(120), unique=True)
    password_hash: Mapped[str] = mapped_column(String(200))  # argon2id
    role: Mapped[str] = mapped_column(String(20))  # tenant-owner | tenant-member
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_login_at: Mapped[datetime | None] = mapped_column(nullable=True)
    tenant: Mapped[Tenant] = relationship()


class PortalSession(Base):
    """A logged-in portal user: the cookie holds the secret, the table only its sha256."""

    __tablename__ = "portal_sessions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("portal_users.id", ondelete="CASCADE"), index=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    csrf_token: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime] = mapped_column()
    user: Mapped[PortalUser] = relationship()


class PortalKeyCaps(Base):
    """What a tenant's portal users may issue: how many live keys, which models, which limits
    at most (None: the tenant's own). Set by an operator; no row: DEFAULT_MAX_KEYS, no caps."""

    __tablename__ = "portal_key_caps"
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    max_keys: Mapped[int] = mapped_column(Integer, default=DEFAULT_MAX_KEYS)
    allowed_models: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    max_rpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_tpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_concurrency: Mapped[int | None] = mapped_column(Integer, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
