"""The Redis keys of a tenant's limits: its buckets, concurrency holders and quota counters,
all in the tenant's hash slot (Redis Cluster), its API keys' beside them."""

from __future__ import annotations

from laneway.types import TenantSnapshot


class LimitKeys:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._cache: dict[tuple[int, int, tuple[str, ...]], list[str]] = {}

    def tenant(self, tenant_id: int) -> list[str]:
        """The tenant's rpm and tpm buckets and its concurrency holders."""
        base = f"{self.prefix}rl:{{{tenant_id}}}:"  # one hash slot per tenant (Redis Cluster)
        return [base + "rpm", base + "tpm", base + "inflight"]

    def counter(self, tenant_id: int, period_name: str) -> str:
        return f"{self.prefix}rl:{{{tenant_id}}}:used:{period_name}"

    def epoch(self, tenant_id: int, period_name: str) -> str:
        """The counter's epoch hash: when it began counting, and what was added from the usage rows."""
        return f"{self.prefix}rl:{{{tenant_id}}}:epoch:{period_name}"

    def for_call(self, tenant: TenantSnapshot, periods: tuple[str, ...]) -> list[str]:
        """reserve.lua's and settle.lua's KEYS; the key's buckets share its tenant's hash slot.
        Kept per tenant, key and periods (eleven strings built on every call otherwise)."""
        at = (tenant.id, tenant.api_key_id, periods)
        keys = self._cache.get(at)
        if keys is None:
            if len(self._cache) >= 4096:  # a new day: the old periods' lists go
                self._cache.clear()
            keys = self._cache[at] = self._build(tenant, periods)
        return keys

    def _build(self, tenant: TenantSnapshot, periods: tuple[str, ...]) -> list[str]:
        key_base = f"{self.prefix}rl:{{{tenant.id}}}:key:{tenant.api_key_id}:"
        return [
            *self.tenant(tenant.id),
            key_base + "rpm",
            key_base + "tpm",
            key_base + "inflight",
            *(self.counter(tenant.id, name) for name in periods),
            *(self.epoch(tenant.id, name) for name in periods),
        ]
