"""Admin operations on one replica (deployment) of an alias, beside add and remove
(admin/deployments.py): drain or resume it, disable or enable it, swap its engine.

Draining is a flag on the row that routing reads (the engine keeps running and finishes what
it serves): it is applied to this replica's registry at once and to the others by NOTIFY,
without restarting anything. Enabling and swapping go through put_model: the new engine
starts and warms up before the old one stops taking requests, and one that cannot start is
refused with the engine's reason, nothing changed."""

from __future__ import annotations

from typing import Any

from laneway.admin.deployments import DeploymentIn, ModelIn, put_model, replicas
from laneway.admin.service import AdminService
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.db.models import Deployment
from laneway.db.repositories import AuditRepository, ModelRepository


def _find(current: list[DeploymentIn], alias: str, name: str) -> DeploymentIn:
    if not current:
        raise GatewayError(ErrorCode.NOT_FOUND, f"No model named '{alias}'.", param="alias")
    for d in current:
        if d.name == name:
            return d
    names = ", ".join(d.name for d in current)
    raise GatewayError(ErrorCode.NOT_FOUND, f"'{alias}' has no replica '{name}' (it has {names}).", param="name")


async def alias_replica(session: Any, alias: str, name: str) -> tuple[list[Deployment], Deployment]:
    """The alias's deployments (oldest first) and its replica `name`: 404 naming what is missing."""
    model = await ModelRepository(session).get(alias)
    rows = sorted(model.deployments, key=lambda d: d.id) if model is not None else []
    if not rows:
        raise GatewayError(ErrorCode.NOT_FOUND, f"No model named '{alias}'.", param="alias")
    found = next((d for d in rows if d.name == name), None)
    if found is None:
        names = ", ".join(d.name for d in rows)
        raise GatewayError(ErrorCode.NOT_FOUND, f"'{alias}' has no replica '{name}' (it has {names}).", param="name")
    return rows, found


async def set_draining(svc: AdminService, actor: str, alias: str, name: str, draining: bool) -> dict[str, Any]:
    """Drain a replica (routing sends it no new request; those it runs finish) or take it back.
    The alias keeps one replica taking requests: draining the last is refused."""
    async with svc.sessions() as session, session.begin():
        rows, found = await alias_replica(session, alias, name)
        before = bool(found.draining)
        if draining and not any(d.enabled and not d.draining for d in rows if d.name != name):
            raise GatewayError(
                ErrorCode.CONFLICT,
                f"'{name}' is the only replica of '{alias}' taking requests; add or resume another before draining it.",
                param="name",
            )
        if before != draining:
            found.draining = draining
            await session.flush()
            await AuditRepository(session).add(
                actor, "update", "deployment", name, {"draining": before}, {"draining": draining}
            )
    if before != draining:
        if svc.registry is not None:
            svc.registry.set_draining(name, draining)  # here at once; the other replicas on NOTIFY
        await svc.config_changes.notify()
    return {"alias": alias, "name": name, "draining": draining}


async def set_enabled(svc: AdminService, actor: str, alias: str, name: str, enabled: bool) -> dict[str, Any]:
    """Disable a replica (its row kept, its engine stopped once it has finished what it runs) or
    enable it again (its engine started and warmed first: refused with the engine's reason)."""
    current = await replicas(svc, alias)
    chosen = _find(current, alias, name)
    if not enabled and not any(d.enabled for d in current if d.name != name):
        raise GatewayError(
            ErrorCode.CONFLICT,
            f"'{name}' is the last enabled replica of '{alias}'; an alias needs one. Add or enable another first.",
            param="name",
        )
    if chosen.enabled == enabled:
        return {"alias": alias, "name": name, "enabled": enabled}
    changed = [DeploymentIn(**{**_fields(d), "enabled": enabled}) if d.name == name else d for d in current]
    await put_model(svc, actor, alias, ModelIn(deployments=changed))
    return {"alias": alias, "name": name, "enabled": enabled}


async def swap_replica(svc: AdminService, actor: str, alias: str, name: str, new: DeploymentIn) -> dict[str, Any]:
    """Serve the replica `name` by another engine (kind and config): the new one starts and warms
    up before the old one stops taking requests; the old one finishes what it runs. It keeps
    its name, whether it is enabled or draining, and its role."""
    current = await replicas(svc, alias)
    old = _find(current, alias, name)
    kept = {f: getattr(old, f) for f in ("enabled", "draining", "role", "weight", "sample")}
    swapped = DeploymentIn(**{**_fields(new), "name": name, **kept})
    result = await put_model(
        svc, actor, alias, ModelIn(deployments=[swapped if d.name == name else d for d in current])
    )
    return {**result, "name": name, "engine_kind": new.engine_kind}


def _fields(d: DeploymentIn) -> dict[str, Any]:
    return {f: getattr(d, f) for f in d.__struct_fields__}
