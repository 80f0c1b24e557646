"""Admin operation on model aliases: point an alias at its deployments, all or nothing (the
new engines start and warm up before the rows change), audited."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta, Struct
from sqlalchemy import select

from laneway.admin.role_checks import Roled, check_roles
from laneway.admin.service import AdminService, row
from laneway.admin.validation import (
    DeploymentName,
    Description,
    EngineKind,
    GpuType,
    Positive,
    Quantization,
    check_text,
)
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.db.models import Deployment, Model
from laneway.db.repositories import AuditRepository, DeploymentSpec, ModelRepository
from laneway.engines.config import EngineConfigError
from laneway.engines.kinds import check_config, engine_kind_names
from laneway.engines.registry import EngineStartError


class DeploymentIn(Struct, forbid_unknown_fields=True):
    name: DeploymentName
    engine_kind: EngineKind
    config: dict[str, Any] = {}
    quantization: Quantization = "unknown"
    gpu_type: GpuType = "none"
    max_model_len: Positive = 2048
    enabled: bool = True  # false: the row is kept, nothing is served from it (its engine is stopped)
    draining: bool = False  # true: it takes no new request; those it runs finish
    # Its role in the alias, weight and sample in percent (admin/deployment_roles.py, core/canary/).
    role: str = "serving"
    weight: float = 0.0
    sample: float = 0.0


class ModelIn(Struct, forbid_unknown_fields=True):
    deployments: Annotated[list[DeploymentIn], Meta(max_length=64)]
    description: Description = ""


DEPLOYMENT_FIELDS = (
    "name",
    "engine_kind",
    "config",
    "quantization",
    "gpu_type",
    "max_model_len",
    "enabled",
    "draining",
    "role",
    "weight",
    "sample",
)


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


def check_deployments(data: ModelIn) -> list[str]:
    """The deployments' names, each engine kind known and no name given twice."""
    names = [d.name for d in data.deployments]
    known_kinds = engine_kind_names()
    for i, d in enumerate(data.deployments):
        if d.engine_kind not in known_kinds:
            known = ", ".join(known_kinds)
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
        try:  # a config its engine cannot take is refused here, not left to fail on every replica
            check_config(d.engine_kind, d.config)
        except EngineConfigError as exc:
            raise GatewayError(
                ErrorCode.ENGINE_START_FAILED,
                f"The deployment '{d.name}' cannot start, so nothing was changed: {exc}",
                param=f"deployments[{i}]",
            ) from None
    rows = [Roled(d.name, d.role, d.weight, d.sample, d.enabled) for d in data.deployments]
    check_roles(rows, lambda i, field: f"deployments[{i}].{field}")
    return names


async def put_model(svc: AdminService, actor: str, alias: str, data: ModelIn) -> dict[str, Any]:
    """Point `alias` at `data.deployments`, all or nothing: the new engines start and warm up
    first; if one cannot, the answer is 400 with its reason and nothing changed (rows, the
    engines serving the alias). Otherwise the rows are committed and the started engines
    take over (the old ones finish what they serve), without starting anything twice."""
    check_text("alias", alias, max_length=200)
    names = check_deployments(data)
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
    # A disabled deployment keeps its row and serves nothing: it is not started.
    specs = [
        DeploymentSpec(0, alias=alias, **{k: v for k, v in d.items() if k != "enabled"})
        for d in deployments
        if d["enabled"]
    ]
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


# ---- one replica at a time (the CLI's `laneway model replica add/remove`) ----

MAX_REPLICAS = 64  # ModelIn's bound on an alias's deployments


async def replicas(svc: AdminService, alias: str) -> list[DeploymentIn]:
    """The alias's deployments as put_model takes them; [] for an alias with none or no row."""
    async with svc.sessions() as session:
        model = await ModelRepository(session).get(alias)
        rows = sorted(model.deployments, key=lambda d: d.id) if model is not None else []
        return [
            DeploymentIn(
                name=d.name,
                engine_kind=d.engine_kind,
                config=dict(d.config or {}),
                quantization=d.quantization,
                gpu_type=d.gpu_type,
                max_model_len=d.max_model_len,
                enabled=bool(d.enabled),
                draining=bool(d.draining),
                role=d.role or "serving",
                weight=float(d.weight or 0.0),
                sample=float(d.sample or 0.0),
            )
            for d in rows
        ]


async def add_replica(svc: AdminService, actor: str, alias: str, replica: DeploymentIn) -> dict[str, Any]:
    """Add one deployment to the alias's replicas (the alias is made if new), keeping the
    others as they are: put_model with one more, so the same checks, all or nothing, one audit
    row with the before and after, and the NOTIFY."""
    current = await replicas(svc, alias)
    if any(d.name == replica.name for d in current):
        raise GatewayError(
            ErrorCode.CONFLICT,
            f"'{replica.name}' is already a replica of '{alias}'; remove it first to change it.",
            param="name",
        )
    if len(current) >= MAX_REPLICAS:
        raise GatewayError(
            ErrorCode.INVALID_REQUEST,
            f"'{alias}' has {len(current)} replicas, the most an alias may have.",
            param="name",
        )
    return await put_model(svc, actor, alias, ModelIn(deployments=[*current, replica]))


async def remove_replica(svc: AdminService, actor: str, alias: str, name: str) -> dict[str, Any]:
    """Take one deployment out of the alias's replicas, keeping the others (put_model with one
    fewer); its engine finishes what it serves. The last one stays: an alias with no replica
    could serve nothing."""
    current = await replicas(svc, alias)
    if not current:
        raise GatewayError(ErrorCode.NOT_FOUND, f"No model named '{alias}'.", param="alias")
    kept = [d for d in current if d.name != name]
    if len(kept) == len(current):
        names = ", ".join(d.name for d in current)
        raise GatewayError(ErrorCode.NOT_FOUND, f"'{alias}' has no replica '{name}' (it has {names}).", param="name")
    if not any(d.enabled for d in kept):
        last = "last replica" if not kept else "last enabled replica"
        raise GatewayError(
            ErrorCode.CONFLICT,
            f"'{name}' is the {last} of '{alias}'; an alias needs one. "
            "Add another first, or point the alias elsewhere with `laneway model set`.",
            param="name",
        )
    return await put_model(svc, actor, alias, ModelIn(deployments=kept))
