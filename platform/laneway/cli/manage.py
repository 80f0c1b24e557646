"""The `laneway` commands that manage tenants, API keys, model aliases, lanes and admin accounts,
through the admin operations (admin/tenants.py, keys.py, deployments.py, policies.py, accounts.py)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from laneway.cli.flags import (
    KEY_UNSET,
    TENANT_UNSET,
    key_fields,
    lane_fields,
    said,
    tenant_changes,
    tenant_fields,
    valid,
)
from laneway.contracts.codes import ErrorCode

if TYPE_CHECKING:
    from laneway.admin.service import AdminService


async def tenant_id_of(svc: AdminService, name: str) -> int:
    from laneway.contracts.errors import GatewayError
    from laneway.db.repositories import TenantRepository

    async with svc.sessions() as session:
        tenant = await TenantRepository(session).get_by_name(name)
    if tenant is None:
        raise GatewayError(ErrorCode.NOT_FOUND, f"no tenant named '{name}'")
    return int(tenant.id)


async def tenant_create(svc: AdminService, actor: str, args: argparse.Namespace) -> None:
    from laneway.admin import tenants

    raw = {"name": args.name, **tenant_fields(args)}  # "none" is a new tenant's default: left out
    tenant = await tenants.create_tenant(svc, actor, valid(raw, tenants.TenantIn, strict=False))
    print(f"created tenant {tenant['name']} (id {tenant['id']})")


async def tenant_set(svc: AdminService, actor: str, args: argparse.Namespace) -> None:
    from laneway.admin import tenants

    fields = tenant_changes(args)
    data = valid(fields, tenants.TenantIn, strict=False)
    tenant = await tenants.edit_tenant(svc, actor, await tenant_id_of(svc, args.name), data, set(fields))
    print(f"updated tenant {tenant['name']}: {said(tenant, list(fields), TENANT_UNSET)}")


async def key_issue(svc: AdminService, actor: str, args: argparse.Namespace) -> None:
    from laneway.admin import keys

    raw = {"name": args.name, "expires_days": args.expires_days, **key_fields(args)}
    data = valid(raw, keys.KeyIn, strict=False)
    key = await keys.issue_api_key(svc, actor, await tenant_id_of(svc, args.tenant), data)
    print(f"key id {key['id']} for tenant {args.tenant}; the secret is shown only once:", file=sys.stderr)
    print(key["secret"])


async def key_set(svc: AdminService, actor: str, args: argparse.Namespace) -> None:
    from laneway.admin import keys, limits

    fields = key_fields(args)
    data = valid(fields, limits.KeyLimitsIn, strict=False)
    key = await keys.edit_api_key(svc, actor, args.key_id, data, set(fields))
    print(f"updated key {key['id']} ({key['prefix']}...): {said(key, list(fields), KEY_UNSET)}")


async def key_revoke(svc: AdminService, actor: str, args: argparse.Namespace) -> None:
    from laneway.admin import keys

    key = await keys.revoke_api_key(svc, actor, args.key_id)
    print(f"revoked key {key['id']} ({key['prefix']}...)")


def _deployment(args: argparse.Namespace, name: str) -> dict[str, Any]:
    """A deployment's fields from the engine flags (`model set`, `model replica add`)."""
    from laneway.contracts.errors import invalid_request

    try:
        config = json.loads(args.config)
    except ValueError as exc:
        raise invalid_request(f"--config is not JSON: {exc}") from None
    return {
        "name": name,
        "engine_kind": args.engine,
        "config": config,
        "quantization": args.quantization,
        "gpu_type": args.gpu_type,
        "max_model_len": args.max_model_len,
    }


async def model_set(svc: AdminService, actor: str, args: argparse.Namespace) -> None:
    from laneway.admin import deployments

    deployment = _deployment(args, args.deployment or f"{args.alias}-{args.engine}")
    await deployments.put_model(svc, actor, args.alias, valid({"deployments": [deployment]}, deployments.ModelIn))
    print(f"model {args.alias} -> {args.engine}")


def _said_replicas(alias: str, names: list[str]) -> str:
    return f"model {alias} has {len(names)} replica{'s' * (len(names) != 1)}: {', '.join(names)}"


async def model_replica_add(svc: AdminService, actor: str, args: argparse.Namespace) -> None:
    from laneway.admin import deployments

    replica = valid(_deployment(args, args.name), deployments.DeploymentIn)
    result = await deployments.add_replica(svc, actor, args.alias, replica)
    print(_said_replicas(args.alias, result["deployments"]))


async def model_replica_remove(svc: AdminService, actor: str, args: argparse.Namespace) -> None:
    from laneway.admin import deployments

    result = await deployments.remove_replica(svc, actor, args.alias, args.name)
    print(_said_replicas(args.alias, result["deployments"]))


async def model_replica_list(svc: AdminService, actor: str, args: argparse.Namespace) -> None:
    """One line per replica; not the config, which may hold an engine's API key."""
    from laneway.admin import deployments

    del actor  # reads only: nothing to audit
    found = await deployments.replicas(svc, args.alias)
    if not found:
        from laneway.contracts.errors import GatewayError

        raise GatewayError(ErrorCode.NOT_FOUND, f"No model named '{args.alias}'.")
    for d in found:
        facts = f"{d.name}\t{d.engine_kind}\tmax_model_len {d.max_model_len}\t{d.quantization}\t{d.gpu_type}"
        print(f"{facts}\t{_said_role(d)}")


async def model_replica_set(svc: AdminService, actor: str, args: argparse.Namespace) -> None:
    from laneway.admin import deployment_roles

    data = valid(
        {"role": args.role, "weight": args.weight, "sample": args.sample}, deployment_roles.RoleIn, strict=False
    )
    result = await deployment_roles.set_role(svc, actor, args.alias, args.name, data)
    print(f"{result['name']} of {result['alias']}: {_said_role(result)}")


def _said_role(d: Any) -> str:
    get = d.get if isinstance(d, dict) else lambda f: getattr(d, f)
    if get("role") == "canary":
        return f"canary, weight {get('weight'):g} %"
    if get("role") == "shadow":
        return f"shadow, sample {get('sample'):g} %"
    return "serving"


async def model_fallbacks(svc: AdminService, actor: str, args: argparse.Namespace) -> None:
    from laneway.admin import fallbacks

    data = valid({"fallbacks": fallbacks.split_aliases(args.fallbacks)}, fallbacks.FallbacksIn)
    result = await fallbacks.set_fallbacks(svc, actor, args.alias, data)
    print(f"model {args.alias} falls back to {', '.join(result['fallbacks']) or 'nothing'}")


async def model_price(svc: AdminService, actor: str, args: argparse.Namespace) -> None:
    """The figures given replace the price's (the others stay); none given: prints it."""
    from laneway.admin import prices

    given = {"input": args.input, "output": args.output, "cached_input": args.cached_input}
    result = await prices.get_price(svc, args.alias)
    if any(v is not None for v in given.values()):
        figures = {k: result[k] if v is None else None if v.lower() == "none" else v for k, v in given.items()}
        result = await prices.set_price(svc, actor, args.alias, valid(figures, prices.PriceIn))
    if not result["priced"]:
        print(f"model {args.alias} has no price")
        return
    cached = result["cached_input"] if result["cached_input"] is not None else result["input"]
    print(
        f"model {args.alias} costs {result['input']} in, {result['output']} out, {cached} cached in "
        f"({result['currency']} per 1M tokens)"
    )


def _said_lane(lane: dict[str, Any]) -> str:
    def target(ms: int | None, unit: str) -> str:
        return f"{ms} {unit}" if ms is not None else "none"

    cap = lane["max_concurrency"] if lane["max_concurrency"] is not None else "none (learned limit)"
    return (
        f"{lane['name']}\tpriority {lane['priority']}\tqueue timeout {lane['queue_timeout_s']:g} s\t"
        f"TTFT target {target(lane['ttft_target_ms'], 'ms')}\tTPOT target {target(lane['tpot_target_ms'], 'ms/token')}"
        f"\tcap {cap}"
    )


async def lane_list(svc: AdminService, actor: str, args: argparse.Namespace) -> None:
    """One line per lane, in match order: its priority, hard bound and latency targets."""
    from laneway.admin.policies import LANE_FIELDS
    from laneway.admin.service import row
    from laneway.db.repositories import PolicyRepository

    del actor, args  # reads only: nothing to audit
    async with svc.sessions() as session:
        lanes = [row(x, LANE_FIELDS) for x in await PolicyRepository(session).lanes()]
    for lane in lanes:
        print(_said_lane(lane))
    if not lanes:
        print("no lanes: every request goes to one default lane")


async def lane_set(svc: AdminService, actor: str, args: argparse.Namespace) -> None:
    """Change an existing lane's latency targets, queue timeout or cap (only those named)."""
    from laneway.admin import policies
    from laneway.contracts.errors import GatewayError
    from laneway.db.models import Lane
    from laneway.db.repositories import PolicyRepository

    async with svc.sessions() as session:
        if await PolicyRepository(session).find(Lane, args.name) is None:
            raise GatewayError(ErrorCode.NOT_FOUND, f"no lane named '{args.name}'")
    fields = lane_fields(args)
    data = valid(fields, policies.LaneIn, strict=False)
    lane = await policies.put_lane(svc, actor, args.name, data, set(fields))
    print(f"updated lane {args.name}: {said(lane, list(fields), 'none')}")


async def admin_create(svc: AdminService, actor: str, args: argparse.Namespace) -> None:
    import getpass
    import os

    from laneway.admin import accounts

    password = os.environ.get("LANEWAY_NEW_ADMIN_PASSWORD") or getpass.getpass(f"password for {args.username}: ")
    await accounts.create_admin(svc, actor, args.username, password, args.role)
    print(f"created admin {args.username} ({args.role})")


async def portal_user_create(svc: AdminService, actor: str, args: argparse.Namespace) -> None:
    """A user of a tenant's customer portal (/portal); the password as for admins."""
    import getpass
    import os

    from laneway.portal import accounts

    tenant_id = await tenant_id_of(svc, args.tenant)
    password = os.environ.get("LANEWAY_NEW_PORTAL_PASSWORD") or getpass.getpass(f"password for {args.username}: ")
    await accounts.create_portal_user(svc, actor, tenant_id, args.username, password, args.role)
    print(f"created portal user {args.username} of tenant {args.tenant} ({args.role})")


def _said_batch(b: dict[str, Any]) -> str:
    counts = b["request_counts"]
    failed = f" ({counts['failed']} failed)" if counts["failed"] else ""
    return (
        f"{b['id']}\t{b['tenant']}\t{b['status']}\t{b['done']}/{counts['total']} done{failed}\t{b['endpoint']}\t"
        f"created {b['created_at']}\texpires {b['expires_at']}"
    )


async def batch_list(svc: AdminService, actor: str, args: argparse.Namespace) -> None:
    """One line per batch, newest first; when there are more, how to read the next page."""
    from laneway.admin import batches

    del actor  # reads only: nothing to audit
    page = await batches.list_batches(svc, args.tenant, args.after, args.limit)
    for b in page["data"]:
        print(_said_batch(b))
    if not page["data"]:
        print("no batches" + (f" of tenant {args.tenant}" if args.tenant else ""))
    if page["has_more"]:
        print(f"more: laneway batch list --after {page['last_id']}", file=sys.stderr)


async def batch_cancel(svc: AdminService, actor: str, args: argparse.Namespace) -> None:
    from laneway.admin import batches

    b = await batches.cancel_batch(svc, actor, args.batch_id)
    print(
        f"batch {b['id']} of {b['tenant']} is {b['status']}: its pending requests are cancelled, those running finish"
    )
