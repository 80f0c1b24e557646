"""API keys: issue (secret shown once, sha256 stored) and authenticate with a short-lived cache.

The cache keeps the hot path off the database; its TTL (default 0.5 s) bounds how long a
revoked key, an expired key or a disabled tenant can still get through.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from laneway.core.errors import GatewayError
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


class KeyAuthenticator:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], ttl_s: float = 0.5) -> None:
        self._sessions = sessions
        self._ttl = ttl_s
        self._cache: dict[str, tuple[float, TenantSnapshot | GatewayError]] = {}
        self.lookups = 0  # database round trips, for tests and metrics

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
        now = time.monotonic()
        hit = self._cache.get(digest)
        if hit is None or hit[0] <= now:
            hit = (now + self._ttl, await self._lookup(digest))
            if len(self._cache) > 50_000:  # bounded: a key-guessing client can't grow it forever
                self._cache.clear()
            self._cache[digest] = hit
        outcome = hit[1]
        if isinstance(outcome, GatewayError):
            raise outcome
        return outcome

    def invalidate(self) -> None:
        self._cache.clear()

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
            )


def as_utc(ts: datetime) -> datetime:
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)  # SQLite drops the zone
