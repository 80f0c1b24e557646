"""Roles on an alias's deployments (core/canary/): serving, canary with a weight, shadow with a
sample rate, all in percent. Set one replica at a time (the admin API, the alias page, the CLI's
`laneway model replica set`), promoted, rolled back by hand or by laneway itself (the canary
watch), every change audited.

A role is a flag on the row that routing reads, like draining: applied to this replica's
registry at once and to the others when the change is heard (NOTIFY, or the config_version
poll), without restarting an engine. Checked before anything is written (check_roles): a weight
or rate outside 0-100 or not a number, a second shadow, a canary or shadow on an alias with no
serving deployment beside it, canaries taking more than 100 % together: 400 naming the field,
nothing changed."""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from laneway.admin.deployments import ModelIn, put_model, replicas
from laneway.admin.replicas import alias_replica
from laneway.admin.role_checks import Roled, check_roles
from laneway.admin.service import AdminService
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.db.repositories import AuditRepository

Role = Literal["serving", "canary", "shadow"]
Percent = Annotated[float, Meta(ge=0, le=100)]
ROLE_FIELDS = ("role", "weight", "sample")


class RoleIn(Struct, forbid_unknown_fields=True):
    role: Role
    weight: Percent | None = None  # a canary's share of the alias's sessions, in percent
    sample: Percent | None = None  # a shadow's share of the live requests copied to it, in percent


def roled(row: Any) -> Roled:
    return Roled(
        name=row.name,
        role=row.role or "serving",
        weight=float(row.weight or 0.0),
        sample=float(row.sample or 0.0),
        enabled=bool(row.enabled),
    )


async def set_role(
    svc: AdminService, actor: str, alias: str, name: str, data: RoleIn, *, action: str = "update"
) -> dict[str, Any]:
    """Give the replica `name` its role; a weight or sample not given: 0 for the role that uses
    it (a canary at 0 takes no session: the rollback). Audited as `action`."""
    weight = data.weight if data.weight is not None else 0.0
    sample = data.sample if data.sample is not None else 0.0
    async with svc.sessions() as session, session.begin():
        rows, found = await alias_replica(session, alias, name)
        before = {f: getattr(roled(found), f) for f in ROLE_FIELDS}
        role = data.role
        weight = weight if role == "canary" else 0.0
        sample = sample if role == "shadow" else 0.0
        after = {"role": role, "weight": weight, "sample": sample}
        wanted = [roled(d) for d in rows]
        wanted[rows.index(found)] = Roled(name, role, weight, sample, bool(found.enabled))
        check_roles(wanted, lambda i, field: field)
        changed = before != after
        if changed:
            found.role, found.weight, found.sample = role, weight, sample
            await session.flush()
            await AuditRepository(session).add(actor, action, "deployment", name, before, after)
    if changed:
        if svc.registry is not None:  # here at once; the other replicas when they hear of it
            for d in svc.registry.deployments():
                if d.spec.name == name:
                    d.role, d.weight, d.sample = role, weight, sample
        await svc.config_changes.notify()
    return {"alias": alias, "name": name, **after}


async def rollback(svc: AdminService, actor: str, alias: str, name: str) -> dict[str, Any]:
    """The canary `name` takes no new session (weight 0); those it runs finish."""
    async with svc.sessions() as session:
        _, found = await alias_replica(session, alias, name)
        role = found.role
    if role != "canary":
        raise GatewayError(ErrorCode.CONFLICT, f"'{name}' is not a canary of '{alias}' (it is {role}).", param="name")
    return await set_role(svc, actor, alias, name, RoleIn(role="canary", weight=0.0), action="rollback")


async def promote(svc: AdminService, actor: str, alias: str, name: str) -> dict[str, Any]:
    """Make the candidate `name` the serving pool: it serves, and the deployments that served
    leave the alias (removed as `laneway model replica remove` does: they finish what they run)."""
    current = await replicas(svc, alias)
    chosen = next((d for d in current if d.name == name), None)
    if chosen is None:
        raise GatewayError(ErrorCode.NOT_FOUND, f"'{alias}' has no replica '{name}'.", param="name")
    if chosen.role == "serving":
        raise GatewayError(ErrorCode.CONFLICT, f"'{name}' already serves '{alias}'.", param="name")
    kept = [
        type(d)(**{**_asdict(d), "role": "serving", "weight": 0.0, "sample": 0.0}) if d.name == name else d
        for d in current
        if d.name == name or d.role != "serving"
    ]
    result = await put_model(svc, actor, alias, ModelIn(deployments=kept))
    return {**result, "promoted": name}


def _asdict(s: Struct) -> dict[str, Any]:
    return {f: getattr(s, f) for f in s.__struct_fields__}


async def record_rollback(svc: AdminService, alias: str, name: str, reason: str) -> None:
    """laneway's own rollback (core/canary/watch.py), already in force here: the row set to
    weight 0 and audited as laneway's, with the reason, so every replica follows."""
    try:
        await set_role(svc, f"laneway ({reason})", alias, name, RoleIn(role="canary", weight=0.0), action="rollback")
    except Exception:  # the row may be gone (the alias changed meanwhile): nothing to record
        logging.getLogger("laneway.canary").exception("recording the rollback of %s failed", name)
