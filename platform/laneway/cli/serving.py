"""The `laneway` commands that run or prepare a gateway: serve (after a preflight that says in
one line what would stop it), migrate, make-demo-model, fetch-model, import-policies."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from laneway.settings import Settings


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
    from laneway.core.dispatch import RoutingParams

    try:
        RoutingParams.from_settings(settings)  # the routing profile names registered scorers
    except ValueError as exc:
        return str(exc)
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


async def cmd_import_policies(sessions: Any, args: argparse.Namespace) -> None:
    from laneway.bootstrap import POLICIES_DIR, import_policies

    n = await import_policies(sessions, Path(args.dir) if args.dir else POLICIES_DIR)
    print(f"imported {n} lanes and task policies")
