"""Admin operations shared by the JSON API and the web UI: each one validates, writes,
audits (who, what, before/after) and applies the change to the running gateway."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import msgspec
from msgspec import Meta, Struct
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from laneway.admin.limits import KEY_LIMIT_FIELDS, KeyLimitsIn, KeyModels, check_key_limits
from laneway.admin.security import MIN_PASSWORD_CHARS, hash_password
from laneway.admin.validation import (
    DeploymentName,
    Description,
    EngineKind,
    ExpiresDays,
    GpuType,
    Int32,
    KeyName,
    LaneName,
    ModelAlias,
    Positive,
    Quantization,
    TenantName,
    TokenQuota,
    check_text,
)
from laneway.bootstrap import issue_key
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.core.auth import KeyAuthenticator
from laneway.core.config_watch import ConfigChanges
from laneway.core.policy import PolicyStore
from laneway.db.models import ApiKey, Deployment, Lane, Model, TaskPolicy, Tenant
from laneway.db.repositories import (
    AdminRepository,
    AuditRepository,
    DeploymentSpec,
    ModelRepository,
    PolicyRepository,
)
from laneway.db.session import make_sessionmaker
from laneway.engines.registry import ENGINE_KINDS, EngineRegistry, EngineStartError


@dataclass(frozen=True)
class AdminService:
    """What an admin change needs: the database, the NOTIFY that tells every serving replica,
    and, in a serving process, the running parts it applies the change to at once. The CLI
    serves nothing (None): the replicas hear of its changes through NOTIFY or their poll."""

    sessions: async_sessionmaker[AsyncSession]
    config_changes: ConfigChanges
    authenticator: KeyAuthenticator | None = None
    policies: PolicyStore | None = None
    registry: EngineRegistry | None = None

    @classmethod
    def not_serving(cls, engine: AsyncEngine) -> AdminService:
        """For a process that serves nothing (the CLI): the database and the NOTIFY only."""

        async def nothing_to_apply() -> None:  # it never listens, so never applies
            pass

        return cls(make_sessionmaker(engine), ConfigChanges(engine, nothing_to_apply))

    def drop_cached_keys(self) -> None:
        if self.authenticator is not None:
            self.authenticator.invalidate()

    async def reload_policies(self) -> None:
        if self.policies is not None:
            await self.policies.reload()


TENANT_FIELDS = ("id", "name", "weight", "rpm", "tpm", "max_concurrency", "allowed_models", "allowed_lanes",
                 "priority_floor", "tokens_per_day", "tokens_per_month", "disabled")  # fmt: skip
KEY_FIELDS = ("id", "tenant_id", "name", "prefix", "created_at", "expires_at", "revoked_at", "last_used_at",
              *KEY_LIMIT_FIELDS)  # fmt: skip
PRIORITY_FLOOR_RANGE = (-1000, 1000)


class TenantIn(Struct, omit_defaults=True, forbid_unknown_fields=True):
    name: TenantName | None = None
    weight: Annotated[float, Meta(gt=0, le=100)] | None = None
    rpm: Positive | None = None
    tpm: Positive | None = None
    max_concurrency: Positive | None = None
    allowed_models: Annotated[list[ModelAlias], Meta(max_length=1000)] | None = None
    # Lanes the tenant may pick with X-Laneway-Lane (null or empty: none; the lane rules decide).
    allowed_lanes: Annotated[list[LaneName], Meta(max_length=100)] | None = None
    # The most urgent X-Laneway-Priority it may ask for (lower runs first; more urgent is clamped).
    priority_floor: Annotated[int, Meta(ge=PRIORITY_FLOOR_RANGE[0], le=PRIORITY_FLOOR_RANGE[1])] | None = None
    # Tokens (prompt + completion) per UTC day / calendar month; null: no quota.
    tokens_per_day: TokenQuota | None = None
    tokens_per_month: TokenQuota | None = None
    disabled: bool | None = None


class KeyIn(Struct, forbid_unknown_fields=True):
    name: KeyName = "default"
    expires_days: ExpiresDays | None = None
    # The key's own limits, in addition to the tenant's (admin/limits.py); null: the tenant's only.
    rpm: Positive | None = None
    tpm: Positive | None = None
    max_concurrency: Positive | None = None
    allowed_models: KeyModels | None = None


class LaneIn(Struct, omit_defaults=True, forbid_unknown_fields=True):
    position: Int32 | None = None
    priority: Int32 | None = None
    match_max_prompt_tokens: Positive | None = None
    match_stream: bool | None = None
    match_tasks: Annotated[list[LaneName], Meta(max_length=100)] | None = None
    max_queue_depth: Positive | None = None
    queue_timeout_s: Annotated[float, Meta(gt=0, le=86_400)] | None = None
    max_concurrency: Positive | None = None
    max_unacked_tokens: Positive | None = None
    retry_after_s: Annotated[int, Meta(ge=1, le=86_400)] | None = None


class TaskIn(Struct, omit_defaults=True, forbid_unknown_fields=True):
    max_tokens: Positive | None = None
    long_prompt_tokens: Positive | None = None
    long_prompt_max_tokens: Positive | None = None
    stop: Annotated[list[Annotated[str, Meta(min_length=1, max_length=200)]], Meta(max_length=16)] | None = None


class DeploymentIn(Struct, forbid_unknown_fields=True):
    name: DeploymentName
    engine_kind: EngineKind
    config: dict[str, Any] = {}
    quantization: Quantization = "unknown"
    gpu_type: GpuType = "none"
    max_model_len: Positive = 2048


class ModelIn(Struct, forbid_unknown_fields=True):
    deployments: Annotated[list[DeploymentIn], Meta(max_length=64)]
    description: Description = ""


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
        raise GatewayError(ErrorCode.NOT_FOUND, f"No {model.__tablename__[:-1]} with id {ident}.")
    return found


def _cannot_clear(field: str) -> GatewayError:
    return GatewayError(ErrorCode.INVALID_REQUEST, f"{field} cannot be cleared; give it a value.", param=field)


async def _check_name_free(session: AsyncSession, name: str, tenant_id: int | None = None) -> None:
    found = (await session.execute(select(Tenant).where(Tenant.name == name))).scalar_one_or_none()
    if found is not None and found.id != tenant_id:
        raise GatewayError(ErrorCode.CONFLICT, f"A tenant named '{name}' exists.", param="name")


async def create_tenant(svc: AdminService, actor: str, data: TenantIn) -> dict[str, Any]:
    if not data.name:
        raise GatewayError(ErrorCode.INVALID_REQUEST, "A tenant needs a name.", param="name")
    async with svc.sessions() as session, session.begin():
        await _check_name_free(session, data.name)
        # Fields left out (None) take the column's default: weight 1, priority_floor 0, enabled.
        tenant = Tenant(**{k: v for k, v in msgspec.structs.asdict(data).items() if v is not None})
        session.add(tenant)
        await session.flush()
        after = row(tenant, TENANT_FIELDS)
        await AuditRepository(session).add(actor, "create", "tenant", str(tenant.id), None, after)
    await svc.config_changes.notify()
    return after


async def edit_tenant(
    svc: AdminService, actor: str, tenant_id: int, data: TenantIn, fields: set[str]
) -> dict[str, Any]:
    """Set exactly `fields` (those the admin sent) from `data`; None clears a nullable field
    (a limit, the allow-lists) and is refused for the others."""
    columns = Tenant.__table__.c
    changes = {f: getattr(data, f) for f in fields & set(TENANT_FIELDS) - {"id"}}
    for field, value in changes.items():
        if value is None and not columns[field].nullable:
            raise _cannot_clear(field)
    async with svc.sessions() as session, session.begin():
        tenant = await get_or_404(session, Tenant, tenant_id)
        if changes.get("name") is not None:
            await _check_name_free(session, changes["name"], tenant_id)
        before = row(tenant, TENANT_FIELDS)
        for field, value in changes.items():
            setattr(tenant, field, value)
        await session.flush()
        after = row(tenant, TENANT_FIELDS)
        await AuditRepository(session).add(actor, "update", "tenant", str(tenant_id), before, after)
    svc.drop_cached_keys()  # limits and grants apply to the next request
    await svc.config_changes.notify()  # and on every other replica
    return after


def expires_at(data: KeyIn) -> datetime | None:
    """When a key issued with `data` expires (validated: 0 < expires_days <= 36500)."""
    return datetime.now(UTC) + timedelta(days=data.expires_days) if data.expires_days is not None else None


async def issue_api_key(svc: AdminService, actor: str, tenant_id: int, data: KeyIn) -> dict[str, Any]:
    expires = expires_at(data)
    limits = {f: getattr(data, f) for f in KEY_LIMIT_FIELDS if getattr(data, f) is not None}
    async with svc.sessions() as session:
        tenant = await get_or_404(session, Tenant, tenant_id)
        check_key_limits(tenant, limits)  # before the key exists: refused means nothing issued
        name = tenant.name
    key_id, secret = await issue_key(svc.sessions, name, name=data.name, expires_at=expires)
    async with svc.sessions() as session, session.begin():
        key = await get_or_404(session, ApiKey, key_id)
        for field, value in limits.items():  # nobody holds the secret yet: no request saw it without them
            setattr(key, field, value)
        await session.flush()
        after = row(key, KEY_FIELDS)
        await AuditRepository(session).add(actor, "issue", "api_key", str(key_id), None, after)
    return {**after, "secret": secret}  # shown once; only its sha256 is stored


async def edit_api_key(
    svc: AdminService, actor: str, key_id: int, data: KeyLimitsIn, fields: set[str]
) -> dict[str, Any]:
    """Set the key's own limits named in `fields` (null clears one: the tenant's applies)."""
    changes = {f: getattr(data, f) for f in fields & set(KEY_LIMIT_FIELDS)}
    async with svc.sessions() as session, session.begin():
        key = await get_or_404(session, ApiKey, key_id)
        check_key_limits(await get_or_404(session, Tenant, key.tenant_id), changes)
        before = row(key, KEY_FIELDS)
        for field, value in changes.items():
            setattr(key, field, value)
        await session.flush()
        after = row(key, KEY_FIELDS)
        await AuditRepository(session).add(actor, "update", "api_key", str(key_id), before, after)
    svc.drop_cached_keys()  # the key's next request has them
    await svc.config_changes.notify()
    return after


async def revoke_api_key(svc: AdminService, actor: str, key_id: int) -> dict[str, Any]:
    async with svc.sessions() as session, session.begin():
        key = await get_or_404(session, ApiKey, key_id)
        before = row(key, KEY_FIELDS)
        key.revoked_at = key.revoked_at or datetime.now(UTC)
        await session.flush()
        after = row(key, KEY_FIELDS)
        await AuditRepository(session).add(actor, "revoke", "api_key", str(key_id), before, after)
    svc.drop_cached_keys()
    await svc.config_changes.notify()
    return after


# A policy field that is a list clears to [] where its column holds no null.
_CLEARED_TO: dict[str, Any] = {"stop": []}


def _put_fields(model: type[Any], data: Struct, sent: set[str]) -> dict[str, Any]:
    """PUT sets exactly the fields sent: the others keep their value (a new row: the column
    default). An explicit null clears a nullable field (a lane rule then matches anything)
    and is refused for a field that must have a value."""
    columns = model.__table__.c
    out: dict[str, Any] = {}
    for field in sorted(sent & set(data.__struct_fields__)):
        value = getattr(data, field)
        if value is None:
            if field in _CLEARED_TO:
                value = list(_CLEARED_TO[field])
            elif not columns[field].nullable:
                raise _cannot_clear(field)
        out[field] = value
    return out


async def put_lane(svc: AdminService, actor: str, name: str, data: LaneIn, sent: set[str]) -> dict[str, Any]:
    check_text("name", name, max_length=60)
    return await _put_policy(svc, actor, "lane", Lane, LANE_FIELDS, name, data, sent)


async def put_task(svc: AdminService, actor: str, task: str, data: TaskIn, sent: set[str]) -> dict[str, Any]:
    check_text("task", task, max_length=60)
    return await _put_policy(svc, actor, "task", TaskPolicy, TASK_FIELDS, task, data, sent)


async def _put_policy(
    svc: AdminService,
    actor: str,
    entity: str,
    model: type[Any],
    fields: tuple[str, ...],
    key: str,
    data: Struct,
    sent: set[str],
) -> dict[str, Any]:
    """Create or update a lane or task policy, audit it, and apply it to the next request."""
    values = _put_fields(model, data, sent)
    async with svc.sessions() as session, session.begin():
        repo = PolicyRepository(session)
        existing = await repo.find(model, key)
        before = row(existing, fields) if existing else None
        after = row(await repo.upsert(model, key, **values), fields)
        await AuditRepository(session).add(actor, "update" if before else "create", entity, key, before, after)
    await svc.reload_policies()  # the next request routes by it
    await svc.config_changes.notify()
    return after


async def _commit_model(
    svc: AdminService, actor: str, alias: str, data: ModelIn, deployments: list[dict[str, Any]]
) -> bool:
    """Write the alias's rows and their audit row; whether the model is enabled."""
    async with svc.sessions() as session, session.begin():
        repo = ModelRepository(session)
        old = await repo.get(alias)
        before = {"deployments": [row(d, DEPLOYMENT_FIELDS) for d in old.deployments]} if old else None
        model = await repo.upsert(alias, description=data.description, deployments=deployments)
        after = {"deployments": deployments}
        await AuditRepository(session).add(actor, "update" if old else "create", "model", alias, before, after)
        return bool(model.enabled)


async def create_admin(svc: AdminService, actor: str, username: str, password: str) -> dict[str, Any]:
    """A new admin account (the password's rules as at first start), audited."""
    check_text("username", username, max_length=100)
    if len(password) < MIN_PASSWORD_CHARS:
        raise GatewayError(
            ErrorCode.INVALID_REQUEST,
            f"An admin password needs at least {MIN_PASSWORD_CHARS} characters.",
            param="password",
        )
    async with svc.sessions() as session, session.begin():
        admins = AdminRepository(session)
        if await admins.get_by_username(username) is not None:
            raise GatewayError(ErrorCode.CONFLICT, f"An admin named '{username}' exists.", param="username")
        admin = await admins.create(username, hash_password(password))
        await session.flush()
        after = {"id": admin.id, "username": username}
        await AuditRepository(session).add(actor, "create", "admin", str(admin.id), None, after)
    return after


async def put_model(svc: AdminService, actor: str, alias: str, data: ModelIn) -> dict[str, Any]:
    """Point `alias` at `data.deployments`, all or nothing: the new engines start and warm up
    first; if one cannot, the answer is 400 with its reason and nothing changed (rows, the
    engines serving the alias). Otherwise the rows are committed and the started engines
    take over (the old ones finish what they serve), without starting anything twice."""
    check_text("alias", alias, max_length=200)
    names = [d.name for d in data.deployments]
    for i, d in enumerate(data.deployments):
        if d.engine_kind not in ENGINE_KINDS:
            known = ", ".join(sorted(ENGINE_KINDS))
            raise GatewayError(
                ErrorCode.INVALID_REQUEST,
                f"Unknown engine kind '{d.engine_kind}' (known: {known}).",
                param=f"deployments[{i}].engine_kind",
            )
        if d.name in names[:i]:
            raise GatewayError(
                ErrorCode.INVALID_REQUEST,
                f"Two deployments are named '{d.name}'; names must be unique.",
                param=f"deployments[{i}].name",
            )
    async with svc.sessions() as session:
        taken = await session.execute(
            select(Deployment.name, Model.alias).join(Model).where(Deployment.name.in_(names), Model.alias != alias)
        )
        for name, other in taken.all():
            raise GatewayError(
                ErrorCode.CONFLICT,
                f"The deployment name '{name}' is used by the model '{other}'.",
                param=f"deployments[{names.index(name)}].name",
            )
    deployments = [msgspec.structs.asdict(d) for d in data.deployments]
    specs = [DeploymentSpec(0, alias=alias, **d) for d in deployments]
    registry = svc.registry
    if registry is None:  # the CLI: no engines here; the serving replicas start them on NOTIFY
        await _commit_model(svc, actor, alias, data, deployments)
        await svc.config_changes.notify()
        return {"alias": alias, "deployments": names}
    try:
        started = await registry.start(specs)
    except EngineStartError as exc:
        param = f"deployments[{names.index(exc.name)}]"
        raise GatewayError(
            ErrorCode.ENGINE_START_FAILED,
            f"The deployment '{exc.name}' cannot start, so nothing was changed: {exc.reason}",
            param=param,
        ) from None

    async def commit() -> bool:
        return await _commit_model(svc, actor, alias, data, deployments)

    await registry.install(alias, started, commit)
    await svc.config_changes.notify()
    live = [d.spec.name for d in registry.deployments() if d.spec.alias == alias]
    return {"alias": alias, "deployments": live}
