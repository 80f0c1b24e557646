"""The one seeding helper: migrate a database and write models, lanes, task policies, tenants
and their keys."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from laneway.bootstrap import issue_key
from laneway.db import migrate
from laneway.db.repositories import ModelRepository, PolicyRepository, TenantRepository
from laneway.db.session import make_engine, make_sessionmaker


def sim_model(name: str, **config: Any) -> list[dict[str, Any]]:
    """One sim deployment for alias `name` (config: the sim's cost model and concurrency)."""
    return [
        {
            "name": f"{name}-sim",
            "engine_kind": "sim",
            "quantization": "sim",
            "gpu_type": "sim",
            "max_model_len": int(config.pop("max_model_len", 8192)),
            "config": config,
        }
    ]


@dataclass
class KeySpec:
    tenant: str
    expires_at: datetime | None = None
    revoked: bool = False


async def seed(
    url: str,
    *,
    models: Mapping[str, Sequence[dict[str, Any]]] | None = None,
    lanes: Sequence[dict[str, Any]] = (),
    tasks: Sequence[dict[str, Any]] = (),
    tenants: Mapping[str, dict[str, Any]] | None = None,
    keys: Mapping[str, KeySpec] | None = None,
) -> dict[str, str]:
    """Migrate the database at `url` and write models (alias -> deployments), lanes (in match
    order), task policies and tenants (name -> columns). Returns key name -> secret: one key
    per tenant, named after it, unless `keys` says otherwise."""
    engine = make_engine(url)
    await migrate.upgrade(engine)
    sessions = make_sessionmaker(engine)
    async with sessions() as s, s.begin():
        for alias, deployments in (models or {}).items():
            await ModelRepository(s).upsert(alias, deployments=list(deployments))
        policies = PolicyRepository(s)
        for position, lane in enumerate(lanes):
            await policies.upsert_lane(position=position, **lane)
        for task in tasks:
            await policies.upsert_task(**task)
        for name, columns in (tenants or {}).items():
            await TenantRepository(s).create(name, **columns)
    secrets: dict[str, str] = {}
    for key_name, spec in (keys if keys is not None else {t: KeySpec(t) for t in tenants or {}}).items():
        key_id, secrets[key_name] = await issue_key(sessions, spec.tenant, name=key_name, expires_at=spec.expires_at)
        if spec.revoked:
            async with sessions() as s, s.begin():
                await TenantRepository(s).revoke_key(key_id)
    await engine.dispose()
    return secrets
