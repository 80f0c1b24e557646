"""How a `laneway` command that changes data runs: against the configured database, migrated to
head first, with the admin service (the same validation, audit rows and NOTIFY as the admin
API and UI) where it makes an admin change."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from laneway.settings import Settings


async def _on_database(settings: Settings, work: Callable[[Any], Awaitable[Any]]) -> Any:
    """work(engine) against the configured database, migrated to head first; disposed after."""
    from laneway.db import migrate
    from laneway.db.session import make_engine

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.resolved_database_url)
    try:
        await migrate.upgrade(engine)
        return await work(engine)
    finally:
        await engine.dispose()


def with_db(fn: Callable[..., Awaitable[Any]]) -> Callable[[Settings, argparse.Namespace], Any]:
    """Run fn(sessions, args) against the configured database, migrated to head first."""

    def run(settings: Settings, args: argparse.Namespace) -> Any:
        from laneway.db.session import make_sessionmaker

        return asyncio.run(_on_database(settings, lambda engine: fn(make_sessionmaker(engine), args)))

    return run


def _actor() -> str:
    import getpass

    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no passwd entry (a container's arbitrary uid)
        return "cli:unknown"


def with_service(fn: Callable[..., Awaitable[Any]]) -> Callable[[Settings, argparse.Namespace], Any]:
    """Run fn(service, actor, args) with the admin service - the same validation, audit rows
    and NOTIFY to the replicas as the admin API and UI - against the configured database,
    migrated first. A refusal is one line on stderr and exit status 1 (argparse's usage
    errors are 2)."""

    def run(settings: Settings, args: argparse.Namespace) -> Any:
        from laneway.admin.service import AdminService
        from laneway.contracts.errors import GatewayError

        def work(engine: Any) -> Awaitable[Any]:
            return fn(AdminService.not_serving(engine, settings.currency), _actor(), args)

        try:
            return asyncio.run(_on_database(settings, work))
        except GatewayError as exc:
            print(f"laneway: {exc.message}", file=sys.stderr)
            raise SystemExit(1) from None

    return run
