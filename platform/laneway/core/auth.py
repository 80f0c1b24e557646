"""API keys: issue (secret shown once, sha256 stored) and authenticate with a short-lived cache.

The cache keeps the hot path off the database; its TTL (default 0.5 s) bounds how long a
revoked key, an expired key or a disabled tenant can still get through while the database
is up. See KeyAuthenticator for what happens while it is not.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from laneway.core import load_shedding
from laneway.core.dependencies import DependencyHealth
from laneway.core.errors import GatewayError, dependency_unavailable
from laneway.db.repositories import TenantRepository
from laneway.types import TenantSnapshot

KEY_PREFIX = "lw-"


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def new_api_key() -> tuple[str, str, str]:
    """Return (secret, display prefix, sha256); only the last two are ever stored."""
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    return secret, secret[:10], hash_secret(secret)


def _unauthorized(message: str) -> GatewayError:
    return GatewayError(401, message, code="invalid_api_key")


@dataclass(slots=True)
class _Entry:
    outcome: TenantSnapshot | GatewayError
    fresh_until: float  # monotonic: served without asking the database before this
    confirmed_at: float  # when the database last said so
    generation: int  # invalidate() bumps the authenticator's: older entries are not fresh


class KeyAuthenticator:
    """API key -> tenant, off the database's critical path.

    - Fresh entries (younger than ttl_s) are served from memory: the hot path does no I/O.
    - In the last quarter of its ttl, a request still served fresh starts the key's lookup in
      the background (refresh ahead): a key in steady use never makes a request wait on the
      database, and is still never served fresh longer than ttl_s after the database spoke.
    - Past that, the key is looked up again, once however many requests need it at the same
      moment (single flight), so an expiring entry under load costs one query, not hundreds.
    - When the lookup fails or takes longer than lookup_timeout_s (the database is down or
      frozen), the last answer the database gave is served if it is younger than stale_s,
      and for the next second nobody waits on the database at all. A key never seen (or
      seen too long ago) gets 503, not 500.
    """

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        ttl_s: float = 0.5,
        *,
        stale_s: float = 300.0,
        lookup_timeout_s: float = 1.0,
        max_entries: int = 50_000,
        health: DependencyHealth | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sessions = sessions
        self._ttl = ttl_s
        self._stale = stale_s
        self._lookup_timeout = lookup_timeout_s
        self._max_entries = max_entries
        self._health = health or DependencyHealth()
        self._clock = clock
        self._cache: dict[str, _Entry] = {}
        self._inflight: dict[str, asyncio.Task[TenantSnapshot | GatewayError]] = {}
        self._generation = 0
        self._database_down_until = 0.0
        self.lookups = 0  # database round trips, for tests and metrics
        self.served_stale = 0

    @staticmethod
    def bearer(header: str | None) -> str:
        if not header:
            raise _unauthorized("You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.")
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _unauthorized("Malformed Authorization header; expected 'Bearer <key>'.")
        return token.strip()

    async def authenticate(self, authorization: str | None) -> TenantSnapshot:
        digest = hash_secret(self.bearer(authorization))
        entry = self._cache.get(digest)
        now = self._clock()
        if entry is not None and entry.fresh_until > now and entry.generation == self._generation:
            outcome = entry.outcome
            if entry.fresh_until - now < self._ttl * 0.25 and digest not in self._inflight:
                self._start_lookup(digest)  # refresh ahead, off this request's path
        elif entry is not None and now < self._database_down_until and self._usable_stale(entry, now):
            outcome = self._stale_outcome(digest, entry)
        else:
            try:
                with load_shedding.waiting_elsewhere():
                    outcome = await self._lookup_once(digest)
            except Exception as exc:
                self._database_down_until = self._clock() + 1.0
                self._health.failed("database", exc, "serving API keys from the cache")
                if entry is None or not self._usable_stale(entry, now):
                    raise dependency_unavailable("database") from None
                outcome = self._stale_outcome(digest, entry)
        if isinstance(outcome, GatewayError):
            raise outcome.with_traceback(None)  # cached: don't grow one traceback forever
        return outcome

    def invalidate(self) -> None:
        """An admin change: every entry is looked up again before it is served fresh (kept,
        though, as the fallback while the database is down)."""
        self._generation += 1

    def _usable_stale(self, entry: _Entry, now: float) -> bool:
        return now - entry.confirmed_at <= self._stale

    def _stale_outcome(self, digest: str, entry: _Entry) -> TenantSnapshot | GatewayError:
        self.served_stale += 1
        if digest not in self._inflight:  # keep trying in the background: back to fresh at once
            self._start_lookup(digest)
        return entry.outcome

    async def _lookup_once(self, digest: str) -> TenantSnapshot | GatewayError:
        task = self._inflight.get(digest) or self._start_lookup(digest)
        async with asyncio.timeout(self._lookup_timeout):
            return await asyncio.shield(task)  # a timed-out waiter leaves the lookup running

    def _start_lookup(self, digest: str) -> asyncio.Task[TenantSnapshot | GatewayError]:
        task = asyncio.ensure_future(self._lookup_and_cache(digest))
        self._inflight[digest] = task
        task.add_done_callback(lambda t: self._lookup_done(digest, t))
        return task

    def _lookup_done(self, digest: str, task: asyncio.Task[TenantSnapshot | GatewayError]) -> None:
        self._inflight.pop(digest, None)
        if not task.cancelled() and task.exception() is not None:
            self._database_down_until = self._clock() + 1.0

    async def _lookup_and_cache(self, digest: str) -> TenantSnapshot | GatewayError:
        generation = self._generation
        outcome = await self._lookup(digest)
        now = self._clock()
        self._cache.pop(digest, None)  # re-inserted last: the oldest entries are evicted first
        if len(self._cache) >= self._max_entries:  # bounded: a key-guessing client can't grow it
            del self._cache[next(iter(self._cache))]
        self._cache[digest] = _Entry(outcome, now + self._ttl, now, generation)
        self._health.recovered("database")
        return outcome

    async def _lookup(self, digest: str) -> TenantSnapshot | GatewayError:
        self.lookups += 1
        async with self._sessions() as session:
            key = await TenantRepository(session).find_key(digest)
            if key is None:
                return _unauthorized("Incorrect API key provided.")
            if key.revoked_at is not None:
                return _unauthorized("This API key has been revoked.")
            if key.expires_at is not None and as_utc(key.expires_at) <= datetime.now(UTC):
                return _unauthorized("This API key has expired.")
            t = key.tenant
            if t.disabled:
                return GatewayError(403, f"Tenant '{t.name}' is disabled.", code="tenant_disabled")
            return TenantSnapshot(
                id=t.id,
                name=t.name,
                api_key_id=key.id,
                weight=t.weight,
                rpm=t.rpm,
                tpm=t.tpm,
                max_concurrency=t.max_concurrency,
                allowed_models=frozenset(t.allowed_models) if t.allowed_models is not None else None,
                allowed_lanes=frozenset(t.allowed_lanes or ()),
                priority_floor=t.priority_floor,
                tokens_per_day=t.tokens_per_day,
                tokens_per_month=t.tokens_per_month,
                key_rpm=key.rpm,
                key_tpm=key.tpm,
                key_max_concurrency=key.max_concurrency,
                key_allowed_models=frozenset(key.allowed_models) if key.allowed_models is not None else None,
            )


def as_utc(ts: datetime) -> datetime:
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)  # SQLite drops the zone
