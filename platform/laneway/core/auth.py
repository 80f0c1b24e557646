"""API keys: issue (secret shown once, sha256 stored) and authenticate with a short-lived cache.

The cache keeps the hot path off the database; its TTL (default 0.5 s) bounds how long a
revoked key, an expired key or a disabled tenant can still get through while the database
is up. The keys in use are confirmed together, one query per half TTL, not one per key.
See KeyAuthenticator for what happens while the database is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError, dependency_unavailable
from laneway.core import load_shedding
from laneway.core.dependencies import DependencyHealth
from laneway.db.repositories import KeyRows
from laneway.types import TenantSnapshot

KEY_PREFIX = "lw-"


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def new_api_key() -> tuple[str, str, str]:
    """Return (secret, display prefix, sha256); only the last two are ever stored."""
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    return secret, secret[:10], hash_secret(secret)


def _unauthorized(message: str) -> GatewayError:
    return GatewayError(ErrorCode.INVALID_API_KEY, message)


@dataclass(slots=True)
class _Entry:
    outcome: TenantSnapshot | GatewayError
    fresh_until: float  # monotonic: served without asking the database before this
    confirmed_at: float  # when the database last said so
    generation: int  # invalidate() bumps the authenticator's: older entries are not fresh
    row: tuple[object, ...] | None  # what the database said (None: no such key): unchanged, no rebuild


class KeyAuthenticator:
    """API key -> tenant, off the database's critical path.

    - Fresh entries (younger than ttl_s) are served from memory: the hot path does no I/O.
    - Every key used within keep_warm_s is confirmed again every ttl_s / 2 by one query for
      all of them (a sweep): a key in steady use, or used once a second, never makes a
      request wait on the database, is never served fresh longer than ttl_s after the
      database spoke, and N keys in use cost one query per sweep, not N lookups (1,000 keys
      at a 0.5 s ttl were ~2,700 queries a second, each rebuilding the tenant).
    - A key not in the cache (first use, or idle for longer than keep_warm_s) or whose entry
      expired is looked up on its request's path, once however many requests need it at the
      same moment (single flight), so an expiring entry under load costs one query, not
      hundreds.
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
        keep_warm_s: float = 10.0,
        max_entries: int = 50_000,
        health: DependencyHealth | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._rows = KeyRows(sessions.kw["bind"])  # the sessions' engine
        self._ttl = ttl_s
        self._stale = stale_s
        self._lookup_timeout = lookup_timeout_s
        self._keep_warm = keep_warm_s
        self._max_entries = max_entries
        self._health = health or DependencyHealth()
        self._clock = clock
        self._cache: dict[str, _Entry] = {}
        self._inflight: dict[str, asyncio.Task[TenantSnapshot | GatewayError]] = {}
        self._used: dict[str, float] = {}  # digest -> when a request last presented it (the sweep's keys)
        self._sweep_timer: asyncio.TimerHandle | None = None
        self._sweeping: asyncio.Task[None] | None = None
        self._swept: frozenset[str] = frozenset()  # the keys the sweep in flight confirms ...
        self._sweep_generation = -1  # ... for this configuration
        self._sweeps: set[asyncio.Task[None]] = set()  # in flight: the latest, and any it superseded
        self._closed = False
        self._generation = 0
        self._database_down_until = 0.0
        self.lookups = 0  # database round trips, for tests and metrics
        self.sweeps = 0  # sweeps that confirmed every warm key in one go
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
        return await self.by_digest(hash_secret(self.bearer(authorization)))

    async def by_digest(self, digest: str) -> TenantSnapshot:
        """The tenant of the key whose secret hashes to `digest` (a batch runs as the key that
        created it, known by its hash only), with the same cache, checks and errors."""
        entry = self._cache.get(digest)
        now = self._clock()
        outcome = self._fresh(entry, now)
        if outcome is None and self._sweep_covers(digest):  # after an admin change: one query for all keys
            if not await self._await_sweep():  # the database is frozen: no second wait on a lookup
                self._database_failed(TimeoutError("key sweep"))
            entry, now = self._cache.get(digest), self._clock()
            outcome = self._fresh(entry, now)
        if outcome is None:
            outcome = await self._unfresh(digest, entry, now)
        if isinstance(outcome, GatewayError):
            raise outcome.with_traceback(None)  # cached: don't grow one traceback forever
        self._used[digest] = now  # a valid key only: a client guessing keys can't grow the sweeps
        if self._sweep_timer is None and self._sweeping is None and not self._closed:
            self._sweep_timer = asyncio.get_running_loop().call_later(self._ttl / 2, self._sweep)
        return outcome

    async def _unfresh(self, digest: str, entry: _Entry | None, now: float) -> TenantSnapshot | GatewayError:
        """A key with no fresh entry: the cache's last answer while the database is down,
        else the database's (looked up once for every request that needs it now)."""
        if entry is not None and now < self._database_down_until and self._usable_stale(entry, now):
            return self._stale_outcome(digest, entry)
        try:
            with load_shedding.waiting_elsewhere():
                return await self._lookup_once(digest)
        except Exception as exc:
            self._database_failed(exc)
            if entry is None or not self._usable_stale(entry, now):
                raise dependency_unavailable(ErrorCode.DATABASE_UNAVAILABLE, "database") from None
            return self._stale_outcome(digest, entry)

    def _fresh(self, entry: _Entry | None, now: float) -> TenantSnapshot | GatewayError | None:
        """The entry's answer if it may be served without asking the database, else None."""
        if entry is not None and entry.fresh_until > now and entry.generation == self._generation:
            return entry.outcome
        return None

    def _database_failed(self, exc: BaseException) -> None:
        """For the next second nobody waits on the database: the cache answers."""
        self._database_down_until = self._clock() + 1.0
        self._health.failed("database", exc, "serving API keys from the cache")

    def invalidate(self) -> None:
        """An admin change: no entry is served fresh before the database confirms it again
        (kept, though, as the fallback while the database is down). The keys in use are
        confirmed by a sweep started now, and their requests wait for it: one query after an
        admin change, not one per key in use."""
        self._generation += 1
        if self._closed or not self._used:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # not on the loop (a script): the next request looks its key up
            return
        if self._sweep_timer is not None:
            self._sweep_timer.cancel()
        self._sweep()  # a sweep in flight answers for the configuration before: it runs out unheeded

    def _sweep_covers(self, digest: str) -> bool:
        return self._sweeping is not None and self._sweep_generation == self._generation and digest in self._swept

    async def _await_sweep(self) -> bool:
        """Wait for the sweep in flight, up to the lookup timeout (False: timed out). It never
        raises: a failed sweep leaves the entry as it was, for the stale path to take over."""
        sweeping = self._sweeping
        assert sweeping is not None
        try:
            with load_shedding.waiting_elsewhere():
                async with asyncio.timeout(self._lookup_timeout):
                    await asyncio.shield(sweeping)  # a request that leaves leaves the sweep running
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        """Stop the sweeps (shutdown)."""
        self._closed = True
        if self._sweep_timer is not None:
            self._sweep_timer.cancel()
            self._sweep_timer = None
        for task in [*self._sweeps, *self._inflight.values()]:  # lookups too: none outlives the loop
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

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
        rows = await self._lookup([digest])
        self._health.recovered("database")
        return self._store(digest, rows.get(digest), generation, self._clock(), requeue=True)

    def _store(
        self, digest: str, row: tuple[object, ...] | None, generation: int, now: float, *, requeue: bool = False
    ) -> TenantSnapshot | GatewayError:
        """Cache what the database said of a key; its snapshot is rebuilt only when it changed."""
        old = self._cache.get(digest)
        if old is not None and old.generation > generation:
            return old.outcome  # an answer from before an admin change: the newer one stays
        if old is not None and old.row == row and row is not None and row[3] is None:  # [3]: expires_at
            outcome = old.outcome  # unchanged (and cannot expire): no rebuild
        else:
            outcome = _outcome(row)
        if requeue or old is None:
            self._cache.pop(digest, None)  # re-inserted last: the oldest entries are evicted first
            if len(self._cache) >= self._max_entries:  # bounded: a key-guessing client can't grow it
                del self._cache[next(iter(self._cache))]
        self._cache[digest] = _Entry(outcome, now + self._ttl, now, generation, row)
        return outcome

    def _sweep(self) -> None:
        """The sweep timer: confirm every key used within keep_warm_s, in one query (a task);
        no keys in use, no timer until the next request."""
        self._sweep_timer = None
        cutoff = self._clock() - self._keep_warm
        used = self._used
        for digest in [d for d, at in used.items() if at < cutoff]:
            del used[digest]
        if used and not self._closed:
            self._swept, self._sweep_generation = frozenset(used), self._generation
            self._sweeping = task = asyncio.get_running_loop().create_task(self._confirm(list(used)), name="auth-sweep")
            self._sweeps.add(task)
            task.add_done_callback(self._sweeps.discard)

    async def _confirm(self, digests: list[str]) -> None:
        me = asyncio.current_task()
        try:
            generation = self._generation
            rows = await self._lookup(digests)
            now = self._clock()
            for digest in digests:
                self._store(digest, rows.get(digest), generation, now)
            self.sweeps += 1
            self._health.recovered("database")
            wait = self._ttl / 2
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the entries expire; requests take the lookup (and stale) path
            self._database_failed(exc)
            wait = max(self._ttl / 2, 1.0)
        finally:
            latest = self._sweeping is me  # else an admin change started a newer one, which goes on
            if latest:
                self._sweeping = None
        if latest and not self._closed and self._sweep_timer is None:
            self._sweep_timer = asyncio.get_running_loop().call_later(wait, self._sweep)

    async def _lookup(self, digests: list[str]) -> dict[str, tuple[object, ...]]:
        """What the database says of these keys (absent: no such key), in one query per 500."""
        found: dict[str, tuple[object, ...]] = {}
        for i in range(0, len(digests), KeyRows.BATCH):
            self.lookups += 1
            for row in await self._rows(digests[i : i + KeyRows.BATCH]):
                found[cast(str, row[0])] = row
        return found


def _outcome(row: tuple[object, ...] | None) -> TenantSnapshot | GatewayError:
    """A key's row (db/repositories.py KeyRows) as what authenticating with it gives."""
    if row is None:
        return _unauthorized("Incorrect API key provided.")
    (
        _,
        key_id,
        revoked_at,
        expires_at,
        key_rpm,
        key_tpm,
        key_conc,
        key_models,
        tenant_id,
        name,
        weight,
        rpm,
        tpm,
        conc,
        models,
        lanes,
        floor,
        per_day,
        per_month,
        disabled,
        budget_day,
        budget_month,
        key_budget_day,
        key_budget_month,
        min_ttft_target,
    ) = row
    if revoked_at is not None:
        return _unauthorized("This API key has been revoked.")
    if isinstance(expires_at, datetime) and as_utc(expires_at) <= datetime.now(UTC):
        return _unauthorized("This API key has expired.")
    if disabled:
        return GatewayError(ErrorCode.TENANT_DISABLED, f"Tenant '{name}' is disabled.")
    return TenantSnapshot(
        id=cast(int, tenant_id),
        name=cast(str, name),
        api_key_id=cast(int, key_id),
        weight=cast(float, weight),
        rpm=cast("int | None", rpm),
        tpm=cast("int | None", tpm),
        max_concurrency=cast("int | None", conc),
        allowed_models=frozenset(cast(list[str], models)) if models is not None else None,
        allowed_lanes=frozenset(cast("list[str] | None", lanes) or ()),
        priority_floor=cast(int, floor),
        min_ttft_target_ms=cast("int | None", min_ttft_target),
        tokens_per_day=cast("int | None", per_day),
        tokens_per_month=cast("int | None", per_month),
        budget_per_day=cast("int | None", budget_day),
        budget_per_month=cast("int | None", budget_month),
        key_budget_per_day=cast("int | None", key_budget_day),
        key_budget_per_month=cast("int | None", key_budget_month),
        key_rpm=cast("int | None", key_rpm),
        key_tpm=cast("int | None", key_tpm),
        key_max_concurrency=cast("int | None", key_conc),
        key_allowed_models=frozenset(cast(list[str], key_models)) if key_models is not None else None,
    )


def as_utc(ts: datetime) -> datetime:
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)  # SQLite drops the zone
