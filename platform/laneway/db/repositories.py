"""Repositories: the only code that writes SQL. Each takes a session; the caller commits."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Column, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import selectinload

from laneway.db import rollups
from laneway.db.models import (
    Admin,
    AdminSession,
    ApiKey,
    AuditEntry,
    Deployment,
    Lane,
    Model,
    TaskPolicy,
    Tenant,
    UsageRecord,
    utcnow,
)
from laneway.db.usage_series import exact_totals

# DeploymentSpec lives in laneway.types (engines build from it without importing the database layer);
# re-exported here for the importers that take it from the repositories.
from laneway.types import DeploymentSpec as DeploymentSpec


class TenantRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def create(self, name: str, **fields: Any) -> Tenant:
        tenant = Tenant(name=name, **fields)
        self.session.add(tenant)
        await self.session.flush()
        return tenant

    async def get_by_name(self, name: str) -> Tenant | None:
        return (await self.session.execute(select(Tenant).where(Tenant.name == name))).scalar_one_or_none()

    async def count(self) -> int:
        return len((await self.session.execute(select(Tenant.id))).all())

    async def add_key(
        self,
        tenant: Tenant,
        *,
        prefix: str,
        secret_sha256: str,
        name: str = "default",
        expires_at: datetime | None = None,
    ) -> ApiKey:
        key = ApiKey(tenant_id=tenant.id, prefix=prefix, secret_sha256=secret_sha256, name=name, expires_at=expires_at)
        self.session.add(key)
        await self.session.flush()
        return key

    async def find_key(self, secret_sha256: str) -> ApiKey | None:
        stmt = select(ApiKey).options(selectinload(ApiKey.tenant)).where(ApiKey.secret_sha256 == secret_sha256)
        return (await self.session.execute(stmt)).scalar_one_or_none()

    async def revoke_key(self, key_id: int) -> bool:
        result = await self.session.execute(
            update(ApiKey).where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None)).values(revoked_at=utcnow())
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]

    async def touch_keys(self, key_ids: Iterable[int], when: datetime) -> None:
        ids = sorted(set(key_ids))
        if ids:
            await self.session.execute(update(ApiKey).where(ApiKey.id.in_(ids)).values(last_used_at=when))


class KeyRows:
    """What authenticating needs of API keys, one row per key found (core/auth.py's _outcome
    reads it by position), many keys in one query, read through the driver's own connection.

    The keys in use are confirmed every quarter second (core/auth.py's sweeps): through an ORM
    session one such query cost ~0.9 ms of CPU (the session, and the async adapter's hop per
    cursor call), through the driver 0.2-0.3 ms (the pooled checkout, with PostgreSQL's
    pre-ping, is most of it). SQLAlchemy still types every value: each column's own result
    processor (SQLite's datetimes, JSON and booleans), as a select through the ORM would."""

    COLUMNS = (
        ApiKey.secret_sha256,
        ApiKey.id,
        ApiKey.revoked_at,
        ApiKey.expires_at,
        ApiKey.rpm,
        ApiKey.tpm,
        ApiKey.max_concurrency,
        ApiKey.allowed_models,
        Tenant.id,
        Tenant.name,
        Tenant.weight,
        Tenant.rpm,
        Tenant.tpm,
        Tenant.max_concurrency,
        Tenant.allowed_models,
        Tenant.allowed_lanes,
        Tenant.priority_floor,
        Tenant.tokens_per_day,
        Tenant.tokens_per_month,
        Tenant.disabled,
        Tenant.budget_per_day,
        Tenant.budget_per_month,
        ApiKey.budget_per_day,
        ApiKey.budget_per_month,
        Tenant.min_ttft_target_ms,
    )
    BATCH = 500  # keys a query

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        dialect = engine.dialect
        self._columns: list[Column[Any]] = [attribute.property.columns[0] for attribute in self.COLUMNS]
        columns = self._columns
        self._postgres = dialect.name == "postgresql"
        # A processor may depend on the driver's type of the column (PostgreSQL's numbers): known
        # there once the statement is prepared; SQLite's drivers name none.
        self._types = None if self._postgres else self._processors([None] * len(columns))
        keys, tenants = ApiKey.__tablename__, Tenant.__tablename__
        names = ", ".join(f"{c.table.name}.{c.name}" for c in columns)
        self._sql = (
            f"SELECT {names} FROM {keys} JOIN {tenants} ON {keys}.tenant_id = {tenants}.id WHERE {keys}.secret_sha256"
        )

    async def __call__(self, digests: Sequence[str]) -> list[tuple[Any, ...]]:
        """The rows of those of `digests` that exist (at most BATCH of them)."""
        assert len(digests) <= self.BATCH
        async with self._engine.connect() as conn:
            driver = (await conn.get_raw_connection()).driver_connection
            assert driver is not None
            if self._postgres:
                sql = self._sql + " = ANY($1::text[])"
                if self._types is None:
                    statement = await driver.prepare(sql)
                    self._types = self._processors([a.type.oid for a in statement.get_attributes()])
                rows: Sequence[Sequence[Any]] = await driver.fetch(sql, list(digests))
            else:
                async with driver.execute(f"{self._sql} IN ({', '.join('?' * len(digests))})", list(digests)) as cursor:
                    rows = await cursor.fetchall()
        types = self._types
        assert types is not None
        return [tuple(v if kind is None else kind(v) for kind, v in zip(types, row, strict=True)) for row in rows]

    def _processors(self, driver_types: list[Any]) -> list[Callable[[Any], Any] | None]:
        dialect = self._engine.dialect
        return [
            c.type.dialect_impl(dialect).result_processor(dialect, t)
            for c, t in zip(self._columns, driver_types, strict=True)
        ]


class ModelRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def get(self, alias: str) -> Model | None:
        stmt = select(Model).options(selectinload(Model.deployments)).where(Model.alias == alias)
        return (await self.session.execute(stmt)).scalar_one_or_none()

    async def upsert(self, alias: str, *, description: str = "", deployments: Sequence[dict[str, Any]]) -> Model:
        """Create the alias or replace its deployments (a registry change, not a code change)."""
        model = await self.get(alias)
        if model is None:
            model = Model(alias=alias, description=description, deployments=[])
            self.session.add(model)
        model.description = description or model.description
        model.deployments.clear()
        await self.session.flush()
        for d in deployments:
            model.deployments.append(Deployment(**d))
        await self.session.flush()
        return model

    async def fallback_graph(self, *, lock: bool = False) -> dict[str, list[str]]:
        """Every alias and its fallback aliases, in order. `lock`: the rows stay locked until
        the transaction ends (PostgreSQL), so two edits cannot each close half of a loop."""
        stmt = select(Model.alias, Model.fallbacks).order_by(Model.alias)
        rows = await self.session.execute(stmt.with_for_update() if lock else stmt)
        return {alias: list(fallbacks or []) for alias, fallbacks in rows.all()}

    async def set_fallbacks(self, alias: str, fallbacks: Sequence[str]) -> None:
        await self.session.execute(update(Model).where(Model.alias == alias).values(fallbacks=list(fallbacks)))

    async def prices(self) -> dict[str, tuple[int, int, int | None]]:
        """alias -> (input, output, cached input) in micro-units per 1M tokens, for the priced aliases."""
        stmt = select(Model.alias, Model.price_input, Model.price_output, Model.price_cached_input).where(
            Model.price_input.is_not(None), Model.price_output.is_not(None)
        )
        rows = (await self.session.execute(stmt)).all()
        return {alias: (i, o, c) for alias, i, o, c in rows if i is not None and o is not None}

    async def set_price(self, alias: str, price: tuple[int | None, int | None, int | None]) -> None:
        i, o, c = price
        stmt = update(Model).where(Model.alias == alias)
        await self.session.execute(stmt.values(price_input=i, price_output=o, price_cached_input=c))

    async def dedicated_to(self, lane: str) -> list[tuple[str, str]]:
        """(alias, deployment) of every deployment row, enabled or not, whose config lists `lane`
        among the lanes it serves."""
        rows = await self.session.execute(select(Model.alias, Deployment.name, Deployment.config).join(Model))
        return [(alias, name) for alias, name, config in rows.all() if lane in ((config or {}).get("lanes") or ())]

    async def enabled_deployments(self) -> list[DeploymentSpec]:
        stmt = (
            select(Deployment, Model.alias)
            .join(Model)
            .where(Model.enabled.is_(True), Deployment.enabled.is_(True))
            .order_by(Deployment.id)
        )
        return [
            DeploymentSpec(
                id=d.id,
                name=d.name,
                alias=alias,
                engine_kind=d.engine_kind,
                config=dict(d.config or {}),
                quantization=d.quantization,
                gpu_type=d.gpu_type,
                max_model_len=d.max_model_len,
                draining=bool(d.draining),
                role=d.role or "serving",
                weight=float(d.weight or 0.0),
                sample=float(d.sample or 0.0),
            )
            for d, alias in (await self.session.execute(stmt)).all()
        ]


PolicyRow = TypeVar("PolicyRow", Lane, TaskPolicy)
_POLICY_KEYS: dict[type[Any], str] = {Lane: "name", TaskPolicy: "task"}


class PolicyRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def lanes(self, *, lock: bool = False) -> list[Lane]:
        """The lanes in match order. `lock`: the rows stay locked until the transaction ends
        (PostgreSQL), so two reorders cannot interleave."""
        stmt = select(Lane).order_by(Lane.position, Lane.id)
        return list((await self.session.execute(stmt.with_for_update() if lock else stmt)).scalars())

    async def task_policies(self) -> list[TaskPolicy]:
        return list((await self.session.execute(select(TaskPolicy).order_by(TaskPolicy.task))).scalars())

    async def find(self, model: type[PolicyRow], key: str) -> PolicyRow | None:
        """A lane by name or a task policy by task."""
        stmt = select(model).where(getattr(model, _POLICY_KEYS[model]) == key)
        return (await self.session.execute(stmt)).scalar_one_or_none()

    async def upsert(self, model: type[PolicyRow], key: str, **fields: Any) -> PolicyRow:
        found = await self.find(model, key)
        if found is None:
            found = model(**{_POLICY_KEYS[model]: key})
            self.session.add(found)
        for k, v in fields.items():
            setattr(found, k, v)
        await self.session.flush()
        return found

    async def delete(self, model: type[PolicyRow], key: str) -> None:
        found = await self.find(model, key)
        if found is not None:
            await self.session.delete(found)
            await self.session.flush()

    async def upsert_lane(self, name: str, **fields: Any) -> Lane:
        return await self.upsert(Lane, name, **fields)

    async def upsert_task(self, task: str, **fields: Any) -> TaskPolicy:
        return await self.upsert(TaskPolicy, task, **fields)


class UsageRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def add_many(self, rows: Sequence[dict[str, Any]]) -> None:
        # Core, not ORM, insert: an executemany without building an object per row. Core compiles
        # the statement from the first row's keys, so rows are grouped by the keys they carry
        # (the gateway's rows all carry the same: one group).
        groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        now = utcnow()
        for r in rows:
            r.setdefault("created_at", now)  # set here, so the row and its buckets agree
            groups.setdefault(tuple(r), []).append(r)
        for group in groups.values():
            await self.session.execute(insert(UsageRecord.__table__), group)  # type: ignore[arg-type]
        await rollups.add(self.session, rows)  # the same transaction: rows and buckets agree

    async def tokens_since(
        self, since: datetime, tenant_id: int | None = None, *, before: datetime | None = None
    ) -> dict[int, int]:
        """Prompt + completion tokens per tenant of the usage created at or after `since` (and
        before `before`, when given): from the rollups, exact to the row (db/usage_series.py)."""
        found = await exact_totals(self.session, since, before, tenant_id=tenant_id, by_key=False)
        out: dict[int, int] = {}
        for (tenant, _), (tokens, _) in found.items():
            out[tenant] = out.get(tenant, 0) + tokens
        return out

    async def cost_since(
        self,
        since: datetime,
        tenant_id: int | None = None,
        *,
        key_id: int | None = None,
        before: datetime | None = None,
    ) -> dict[tuple[int, int | None], int]:
        """Cost (micro-units) per (tenant, API key) of the usage created at or after `since`
        (and before `before`), optionally of one tenant or key: the money budgets' counters."""
        found = await exact_totals(self.session, since, before, tenant_id=tenant_id, key_id=key_id)
        return {slot: cost for slot, (_, cost) in found.items()}

    async def for_tenant(self, tenant_id: int) -> list[UsageRecord]:
        stmt = select(UsageRecord).where(UsageRecord.tenant_id == tenant_id).order_by(UsageRecord.id)
        return list((await self.session.execute(stmt)).scalars())


class AdminRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def create(self, username: str, password_hash: str) -> Admin:
        admin = Admin(username=username, password_hash=password_hash)
        self.session.add(admin)
        await self.session.flush()
        return admin

    async def get_by_username(self, username: str) -> Admin | None:
        return (await self.session.execute(select(Admin).where(Admin.username == username))).scalar_one_or_none()

    async def count(self) -> int:
        return len((await self.session.execute(select(Admin.id))).all())

    async def anyone_logged_in(self) -> bool:
        found = await self.session.execute(select(Admin.id).where(Admin.last_login_at.is_not(None)).limit(1))
        return found.first() is not None

    async def open_session(self, admin: Admin, token_sha256: str, csrf_token: str, expires_at: datetime) -> None:
        admin.last_login_at = utcnow()
        self.session.add(
            AdminSession(admin_id=admin.id, token_sha256=token_sha256, csrf_token=csrf_token, expires_at=expires_at)
        )
        await self.session.flush()

    async def find_session(self, token_sha256: str) -> AdminSession | None:
        stmt = (
            select(AdminSession)
            .options(selectinload(AdminSession.admin))
            .where(AdminSession.token_sha256 == token_sha256)
        )
        return (await self.session.execute(stmt)).scalar_one_or_none()

    async def close_session(self, token_sha256: str) -> None:
        row = await self.find_session(token_sha256)
        if row is not None:
            await self.session.delete(row)


class AuditRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def add(
        self,
        actor: str,
        action: str,
        entity: str,
        entity_id: str,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
    ) -> None:
        self.session.add(
            AuditEntry(actor=actor, action=action, entity=entity, entity_id=entity_id, before=before, after=after)
        )

    async def recent(self, limit: int = 100) -> list[AuditEntry]:
        stmt = select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit)
        return list((await self.session.execute(stmt)).scalars())
