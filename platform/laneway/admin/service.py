"""Admin operations shared by the JSON API and the web UI: each one validates, writes,
audits (who, what, before/after) and applies the change to the running gateway."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import msgspec
from litestar.datastructures import State
from msgspec import Meta, Struct
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from laneway.bootstrap import issue_key
from laneway.core.errors import GatewayError
from laneway.db.models import ApiKey, Lane, TaskPolicy, Tenant
from laneway.db.repositories import AuditRepository, ModelRepository, PolicyRepository

Positive = Annotated[int, Meta(ge=1)]

TENANT_FIELDS = ("id", "name", "weight", "rpm", "tpm", "max_concurrency", "allowed_models", "disabled")
KEY_FIELDS = ("id", "tenant_id", "name", "prefix", "created_at", "expires_at", "revoked_at", "last_used_at")


class TenantIn(Struct, omit_defaults=True):
    name: Annotated[str, Meta(min_length=1, max_length=120)] | None = None
    weight: Annotated[float, Meta(gt=0, le=100)] | None = None
    rpm: Positive | None = None
    tpm: Positive | None = None
    max_concurrency: Positive | None = None
    allowed_models: list[str] | None = None
    disabled: bool | None = None


class KeyIn(Struct):
    name: Annotated[str, Meta(min_length=1, max_length=120)] = "default"
    expires_days: Annotated[float, Meta(gt=0)] | None = None


class LaneIn(Struct, omit_defaults=True):
    position: int | None = None
    priority: int | None = None
    match_max_prompt_tokens: Positive | None = None
    match_stream: bool | None = None
    match_tasks: list[str] | None = None
    max_queue_depth: Positive | None = None
    queue_timeout_s: Annotated[float, Meta(gt=0)] | None = None
    max_concurrency: Positive | None = None
    max_unacked_tokens: Positive | None = None
    retry_after_s: Positive | None = None


class TaskIn(Struct, omit_defaults=True):
    max_tokens: Positive | None = None
    long_prompt_tokens: Positive | None = None
    long_prompt_max_tokens: Positive | None = None
    stop: Annotated[list[str], Meta(max_length=16)] | None = None


class DeploymentIn(Struct):
    name: str
    engine_kind: str
    config: dict[str, Any] = {}
    quantization: str = "unknown"
    gpu_type: str = "none"
    max_model_len: Positive = 2048


class ModelIn(Struct):
    deployments: list[DeploymentIn]
    description: str = ""


LANE_FIELDS = (
    "name", "position", "priority", "match_max_prompt_tokens", "match_stream", "match_tasks", "max_queue_depth",
    "queue_timeout_s", "max_concurrency", "max_unacked_tokens", "retry_after_s",
)  # fmt: skip
TASK_FIELDS = ("task", "max_tokens", "long_prompt_tokens", "long_prompt_max_tokens", "stop")
AUDIT_FIELDS = ("id", "at", "actor", "action", "entity", "entity_id", "before", "after")
DEPLOYMENT_FIELDS = ("name", "engine_kind", "config", "quantization", "gpu_type", "max_model_len", "enabled")


def row(obj: Any, fields: tuple[str, ...]) -> dict[str, Any]:
    out = {}
    for f in fields:
        v = getattr(obj, f)
        out[f] = v.isoformat() if isinstance(v, datetime) else v
    return out


async def get_or_404(session: AsyncSession, model: type[Any], ident: int) -> Any:
    found = await session.get(model, ident)
    if found is None:
        raise GatewayError(404, f"No {model.__tablename__[:-1]} with id {ident}.", code="not_found")
    return found


async def create_tenant(state: State, actor: str, data: TenantIn) -> dict[str, Any]:
    if not data.name:
        raise GatewayError(400, "A tenant needs a name.", code="invalid_request", param="name")
    async with state.sessions() as session, session.begin():
        if (await session.execute(select(Tenant).where(Tenant.name == data.name))).scalar_one_or_none():
            raise GatewayError(409, f"A tenant named '{data.name}' exists.", code="conflict", param="name")
        tenant = Tenant(**msgspec.structs.asdict(data))
        tenant.weight = tenant.weight or 1.0
        tenant.disabled = bool(tenant.disabled)
        session.add(tenant)
        await session.flush()
        after = row(tenant, TENANT_FIELDS)
        await AuditRepository(session).add(actor, "create", "tenant", str(tenant.id), None, after)
    await state.config_changes.notify()
    return after


async def edit_tenant(state: State, actor: str, tenant_id: int, data: TenantIn, fields: set[str]) -> dict[str, Any]:
    """Set `fields` (those the admin sent; a None clears a limit) from `data`."""
    async with state.sessions() as session, session.begin():
        tenant = await get_or_404(session, Tenant, tenant_id)
        before = row(tenant, TENANT_FIELDS)
        for field in fields & set(TENANT_FIELDS) - {"id"}:
            setattr(tenant, field, getattr(data, field))
        await session.flush()
        after = row(tenant, TENANT_FIELDS)
        await AuditRepository(session).add(actor, "update", "tenant", str(tenant_id), before, after)
    state.authenticator.invalidate()  # limits apply to the next request
    await state.config_changes.notify()  # and on every other replica
    return after


async def issue_api_key(state: State, actor: str, tenant_id: int, data: KeyIn) -> dict[str, Any]:
    expires = datetime.now(UTC) + timedelta(days=data.expires_days) if data.expires_days else None
    async with state.sessions() as session:
        name = (await get_or_404(session, Tenant, tenant_id)).name
    key_id, secret = await issue_key(state.sessions, name, name=data.name, expires_at=expires)
    async with state.sessions() as session, session.begin():
        after = row(await get_or_404(session, ApiKey, key_id), KEY_FIELDS)
        await AuditRepository(session).add(actor, "issue", "api_key", str(key_id), None, after)
    return {**after, "secret": secret}  # shown once; only its sha256 is stored


async def revoke_api_key(state: State, actor: str, key_id: int) -> dict[str, Any]:
    async with state.sessions() as session, session.begin():
        key = await get_or_404(session, ApiKey, key_id)
        before = row(key, KEY_FIELDS)
        key.revoked_at = key.revoked_at or datetime.now(UTC)
        await session.flush()
        after = row(key, KEY_FIELDS)
        await AuditRepository(session).add(actor, "revoke", "api_key", str(key_id), before, after)
    state.authenticator.invalidate()
    await state.config_changes.notify()
    return after


def _put_fields(model: type[Any], data: Struct) -> dict[str, Any]:
    """PUT semantics for a policy row: every field is replaced, and a field left out clears
    it where the column allows no value (a lane rule then matches anything); a required
    column left out keeps its current value (or its default)."""
    columns = model.__table__.c
    return {k: v for k, v in msgspec.structs.asdict(data).items() if v is not None or columns[k].nullable}


async def put_lane(state: State, actor: str, name: str, data: LaneIn) -> dict[str, Any]:
    return await _put_policy(state, actor, "lane", Lane, LANE_FIELDS, name, data)


async def put_task(state: State, actor: str, task: str, data: TaskIn) -> dict[str, Any]:
    return await _put_policy(state, actor, "task", TaskPolicy, TASK_FIELDS, task, data)


async def _put_policy(
    state: State, actor: str, entity: str, model: type[Any], fields: tuple[str, ...], key: str, data: Struct
) -> dict[str, Any]:
    """Create or replace a lane or task policy, audit it, and apply it to the next request."""
    async with state.sessions() as session, session.begin():
        repo = PolicyRepository(session)
        existing = await repo.find(model, key)
        before = row(existing, fields) if existing else None
        after = row(await repo.upsert(model, key, **_put_fields(model, data)), fields)
        await AuditRepository(session).add(actor, "update" if before else "create", entity, key, before, after)
    await state.policies.reload()  # the next request routes by it
    await state.config_changes.notify()
    return after


async def put_model(state: State, actor: str, alias: str, data: ModelIn) -> dict[str, Any]:
    deployments = [msgspec.structs.asdict(d) for d in data.deployments]
    async with state.sessions() as session, session.begin():
        repo = ModelRepository(session)
        old = await repo.get(alias)
        before = {"deployments": [row(d, DEPLOYMENT_FIELDS) for d in old.deployments]} if old else None
        await repo.upsert(alias, description=data.description, deployments=deployments)
        after = {"deployments": deployments}
        await AuditRepository(session).add(actor, "update" if old else "create", "model", alias, before, after)
    async with state.sessions() as session:
        specs = await ModelRepository(session).enabled_deployments()
    await state.gateway.registry.sync(specs)  # new engines warm up, then take traffic
    await state.config_changes.notify()
    live = [d.spec.name for d in state.gateway.registry.deployments() if d.spec.alias == alias]
    return {"alias": alias, "deployments": live}
