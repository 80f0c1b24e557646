"""What every admin operation shares (admin/tenants.py, keys.py, policies.py, deployments.py,
accounts.py): the service object they run against, and how a row is read into the JSON an
answer and an audit row carry. Each operation validates, writes, audits (who, what,
before/after) and applies the change to the running gateway."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.core.auth import KeyAuthenticator
from laneway.core.config_watch import ConfigChanges
from laneway.core.lane_caps import LaneCap, lane_caps, seats
from laneway.core.policy import PolicyStore
from laneway.db.session import make_sessionmaker
from laneway.engines.registry import EngineRegistry


@dataclass(frozen=True)
class AdminService:
    """What an admin change needs: the database, the NOTIFY that tells every serving replica,
    and, in a serving process, the running parts it applies the change to at once. The CLI
    serves nothing (None): the replicas hear of its changes through NOTIFY or their poll."""

    sessions: async_sessionmaker[AsyncSession]
    config_changes: ConfigChanges
    authenticator: KeyAuthenticator | None = None
    policies: PolicyStore | None = None
    registry: EngineRegistry | None = None
    currency: str = "USD"  # LANEWAY_CURRENCY: the unit prices and costs are shown in

    @classmethod
    def not_serving(cls, engine: AsyncEngine, currency: str = "USD") -> AdminService:
        """For a process that serves nothing (the CLI): the database and the NOTIFY only."""

        async def nothing_to_apply() -> None:  # it never listens, so never applies
            pass

        return cls(make_sessionmaker(engine), ConfigChanges(engine, nothing_to_apply), currency=currency)

    def drop_cached_keys(self) -> None:
        if self.authenticator is not None:
            self.authenticator.invalidate()

    def lane_caps(self) -> list[LaneCap]:
        """Lanes that cap a served deployment below its engine's sequences (none when not serving)."""
        if self.policies is None or self.registry is None:
            return []
        return lane_caps(self.policies.current.lanes, seats(self.registry))

    async def reload_policies(self) -> None:
        if self.policies is not None:
            await self.policies.reload()


AUDIT_FIELDS = ("id", "at", "actor", "action", "entity", "entity_id", "before", "after")


def row(obj: Any, fields: tuple[str, ...]) -> dict[str, Any]:
    out = {}
    for f in fields:
        v = getattr(obj, f)
        out[f] = v.isoformat() if isinstance(v, datetime) else v
    return out


async def get_or_404(session: AsyncSession, model: type[Any], ident: int) -> Any:
    found = await session.get(model, ident)
    if found is None:
        raise GatewayError(ErrorCode.NOT_FOUND, f"No {model.__tablename__[:-1]} with id {ident}.")
    return found


def cannot_clear(field: str) -> GatewayError:
    return GatewayError(ErrorCode.INVALID_REQUEST, f"{field} cannot be cleared; give it a value.", param=field)
