"""Tables. Migrations in migrations/versions mirror these; change both together."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, false, true
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[str]: JSON, datetime: DateTime(timezone=True)}


class Tenant(Base):
    __tablename__ = "tenants"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(120), unique=True)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    rpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_concurrency: Mapped[int | None] = mapped_column(Integer, nullable=True)
    allowed_models: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    # Lanes this tenant may pick with X-Laneway-Lane (None or empty: none, the rules decide).
    allowed_lanes: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    # The most urgent X-Laneway-Priority it may ask for (lower runs first); below is clamped.
    priority_floor: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # The tightest X-Laneway-TTFT-Target-Ms it may ask for (tighter is clamped to it); None: it
    # may not tighten its lanes' targets at all (migration 0014).
    min_ttft_target_ms: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Token quotas per calendar period in UTC (a day from 00:00, a month from the 1st); None: none.
    # BIGINT: a large tenant's month is past 2**31 tokens.
    tokens_per_day: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    tokens_per_month: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # Money budgets per UTC day and calendar month, in micro-units of LANEWAY_CURRENCY
    # (core/budgets.py); None: none.
    budget_per_day: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    budget_per_month: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    disabled: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    keys: Mapped[list[ApiKey]] = relationship(back_populates="tenant", cascade="all, delete-orphan")


class ApiKey(Base):
    __tablename__ = "api_keys"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(120), default="default")
    prefix: Mapped[str] = mapped_column(String(16))  # shown to admins; the secret never is
    secret_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(nullable=True)
    last_used_at: Mapped[datetime | None] = mapped_column(nullable=True)
    # The key's own limits, enforced in addition to its tenant's (None: the tenant's only).
    rpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_concurrency: Mapped[int | None] = mapped_column(Integer, nullable=True)
    allowed_models: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)  # None: the tenant's
    # The key's own money budgets (micro-units), in addition to its tenant's; None: none.
    budget_per_day: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    budget_per_month: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    tenant: Mapped[Tenant] = relationship(back_populates="keys")

    # A tenant's keys a page at a time, by id, without sorting all of them (migration 0016).
    __table_args__ = (Index("ix_api_keys_tenant_id_id", "tenant_id", "id"),)


class Model(Base):
    """A model alias clients name in requests; served by one or more deployments."""

    __tablename__ = "models"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    alias: Mapped[str] = mapped_column(String(200), unique=True)
    description: Mapped[str] = mapped_column(String(500), default="")
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    # Aliases that serve this one's requests, in order, when it cannot (admin/fallbacks.py
    # refuses an unknown alias and a loop at save); empty: none.
    fallbacks: Mapped[list[str]] = mapped_column(JSON, default=list, server_default="[]")
    # Its price, in micro-units of LANEWAY_CURRENCY per 1M tokens (core/prices.py: integers,
    # exact on every database); input and output both None: not priced. Cached input None:
    # the input price.
    price_input: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    price_output: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    price_cached_input: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    deployments: Mapped[list[Deployment]] = relationship(back_populates="model", cascade="all, delete-orphan")


class Deployment(Base):
    __tablename__ = "deployments"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    engine_kind: Mapped[str] = mapped_column(String(40))  # llamacpp | sim | vllm | trtllm
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    quantization: Mapped[str] = mapped_column(String(40), default="unknown")
    gpu_type: Mapped[str] = mapped_column(String(60), default="none")
    max_model_len: Mapped[int] = mapped_column(Integer, default=2048)
    # False: the row is kept, its engine stopped (nothing is served from it).
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    # True: routing sends it no new request; those it runs finish (an admin's drain before removal).
    draining: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # Its role in the alias (migration 0018): serving | canary (weight: percent of the alias's
    # sessions) | shadow (sample: percent of live requests copied to it, never answered).
    role: Mapped[str] = mapped_column(String(20), default="serving", server_default="serving")
    weight: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    sample: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    model: Mapped[Model] = relationship(back_populates="deployments")


class Lane(Base):
    """A workload lane: first matching lane (by position) takes the request."""

    __tablename__ = "lanes"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(60), unique=True)
    position: Mapped[int] = mapped_column(Integer, default=0)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    match_max_prompt_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    match_stream: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    match_tasks: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    max_queue_depth: Mapped[int] = mapped_column(Integer, default=64)
    queue_timeout_s: Mapped[float] = mapped_column(Float, default=10.0)
    # A policy ceiling per deployment (migration 0019: optional); None: the replica's learned limit.
    max_concurrency: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_unacked_tokens: Mapped[int] = mapped_column(Integer, default=256)
    retry_after_s: Mapped[int] = mapped_column(Integer, default=1)
    # Background lanes (batch work) take an engine slot only when no foreground request can.
    background: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # The lane's latency objectives (migration 0014): time to first token and time per output
    # token after it, in ms; None: no target. queue_timeout_s stays the hard bound.
    ttft_target_ms: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tpot_target_ms: Mapped[int | None] = mapped_column(Integer, nullable=True)


class TaskPolicy(Base):
    __tablename__ = "task_policies"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    task: Mapped[str] = mapped_column(String(60), unique=True)
    max_tokens: Mapped[int] = mapped_column(Integer, default=384)
    long_prompt_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    long_prompt_max_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    stop: Mapped[list[str]] = mapped_column(JSON, default=list)
    # Early stops (core/early_stops.py, migration 0008): the repetition rule's n-gram (None:
    # off) and count; whether a JSON-mode answer ends where its value does.
    repetition_ngram: Mapped[int | None] = mapped_column(Integer, nullable=True)
    repetition_count: Mapped[int] = mapped_column(Integer, default=3, server_default="3")
    json_stop: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())


class UsageRecord(Base):
    __tablename__ = "usage_records"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    request_id: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    tenant_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    api_key_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    model: Mapped[str] = mapped_column(String(200))
    deployment: Mapped[str | None] = mapped_column(String(200), nullable=True)
    lane: Mapped[str | None] = mapped_column(String(60), nullable=True)
    endpoint: Mapped[str] = mapped_column(String(40))
    end_user: Mapped[str | None] = mapped_column(String(200), nullable=True)
    stream: Mapped[bool] = mapped_column(Boolean, default=False)
    status: Mapped[int] = mapped_column(Integer)
    finish_reason: Mapped[str | None] = mapped_column(String(20), nullable=True)
    error_code: Mapped[str | None] = mapped_column(String(60), nullable=True)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    queue_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    ttft_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    total_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Replicas tried, and those that failed before the first byte (comma-separated, in order).
    tries: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    failed_deployments: Mapped[str | None] = mapped_column(String(400), nullable=True)
    # Answers continued on another replica after theirs failed mid-answer, and the prompt
    # tokens those continuations prefilled: laneway's cost, not billed (migration 0015).
    continuations: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    continued_prompt_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    served_model: Mapped[str | None] = mapped_column(String(200), nullable=True)  # a fallback alias that served it
    # The early stop that ended its decoding (repetition, json_complete, json_nesting), if one did.
    early_stop: Mapped[str | None] = mapped_column(String(20), nullable=True)
    # What it cost, in micro-units of LANEWAY_CURRENCY, at the price in force when it was
    # admitted (core/prices.py); None when its model had no price.
    cost_micros: Mapped[int | None] = mapped_column(BigInteger, nullable=True)

    # A tenant's rows by time (the usage page, the CSV export in (created_at, id) order); on
    # PostgreSQL the aggregated columns ride along, for an index-only scan (migration 0005).
    __table_args__ = (
        Index(
            "ix_usage_tenant_created_id",
            "tenant_id",
            "created_at",
            "id",
            postgresql_include=["status", "error_code", "prompt_tokens", "completion_tokens", "ttft_ms"],
        ),
    )


class Admin(Base):
    __tablename__ = "admins"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    username: Mapped[str] = mapped_column(String(120), unique=True)
    password_hash: Mapped[str] = mapped_column(String(200))  # argon2id
    # owner | operator | viewer (admin/roles.py); admins from before migration 0017 are owners.
    role: Mapped[str] = mapped_column(String(20), default="owner", server_default="owner")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_login_at: Mapped[datetime | None] = mapped_column(nullable=True)


class AdminSession(Base):
    """A logged-in admin: the cookie holds the secret, the table only its sha256."""

    __tablename__ = "admin_sessions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    admin_id: Mapped[int] = mapped_column(ForeignKey("admins.id", ondelete="CASCADE"), index=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    csrf_token: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime] = mapped_column()
    admin: Mapped[Admin] = relationship()


class AuditEntry(Base):
    """Every admin change: who, what, and the row before and after."""

    __tablename__ = "audit_log"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(120))
    action: Mapped[str] = mapped_column(String(60))
    entity: Mapped[str] = mapped_column(String(60))
    entity_id: Mapped[str] = mapped_column(String(200))
    before: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    after: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class ConfigVersion(Base):
    """One row (id 1): a counter that database triggers move on every change to models,
    deployments, lanes and task_policies (migration 0013). A replica polls it and reloads its
    configuration only when it moved (runtime/config_poll.py)."""

    __tablename__ = "config_version"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger)
