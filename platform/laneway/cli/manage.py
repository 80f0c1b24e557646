"""The `laneway` commands that manage tenants, API keys, model aliases and admin accounts,
through the admin operations (admin/tenants.py, keys.py, deployments.py, accounts.py)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from laneway.cli.flags import (
    KEY_UNSET,
    TENANT_UNSET,
    key_fields,
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


async def model_set(svc: AdminService, actor: str, args: argparse.Namespace) -> None:
    from laneway.admin import deployments
    from laneway.contracts.errors import invalid_request

    try:
        config = json.loads(args.config)
    except ValueError as exc:
        raise invalid_request(f"--config is not JSON: {exc}") from None
    deployment = {
        "name": args.deployment or f"{args.alias}-{args.engine}",
        "engine_kind": args.engine,
        "config": config,
        "quantization": args.quantization,
        "gpu_type": args.gpu_type,
        "max_model_len": args.max_model_len,
    }
    await deployments.put_model(svc, actor, args.alias, valid({"deployments": [deployment]}, deployments.ModelIn))
    print(f"model {args.alias} -> {args.engine}")


async def model_fallbacks(svc: AdminService, actor: str, args: argparse.Namespace) -> None:
    from laneway.admin import fallbacks

    data = valid({"fallbacks": fallbacks.split_aliases(args.fallbacks)}, fallbacks.FallbacksIn)
    result = await fallbacks.set_fallbacks(svc, actor, args.alias, data)
    print(f"model {args.alias} falls back to {', '.join(result['fallbacks']) or 'nothing'}")


async def admin_create(svc: AdminService, actor: str, args: argparse.Namespace) -> None:
    import getpass
    import os

    from laneway.admin import accounts

    password = os.environ.get("LANEWAY_NEW_ADMIN_PASSWORD") or getpass.getpass(f"password for {args.username}: ")
    await accounts.create_admin(svc, actor, args.username, password)
    print(f"created admin {args.username}")
