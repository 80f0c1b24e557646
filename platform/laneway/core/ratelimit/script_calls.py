"""The ARGV of the Redis limiter's reserve (reserve.lua), and the money budgets' part of its
calls (core/budgets.py): the KEYS and ARGV reserve.lua and settle.lua take after the token
limits', and what the reserve's reply says of the budget counters. Nothing is added for a
tenant and key without a budget."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from laneway.core.budgets import AlertHook, Budget
from laneway.core.quota import Period, quota_limit
from laneway.core.ratelimit.protocol import Reservation
from laneway.core.ratelimit.redis_keys import LimitKeys
from laneway.types import TenantSnapshot

# A concurrency slot whose holder vanished (a replica crashed) is reclaimed after this long.
STALE_HOLDER_S = 600
# A period's counter outlives its period by this much (a settle that lands just after the
# boundary still finds it; admins can read yesterday's for a while).
COUNTER_GRACE_S = 3600

FIRST_REPLY = 12  # reserve.lua's reply: the token limits' part, then the budgets'


def reserve_args(
    tenant: TenantSnapshot,
    tokens: int,
    request_id: str,
    admitted: bool,
    periods: Sequence[Period],
    wall: float,
    spend: Sequence[Budget],
    cost: int,
    alert_share: float = 0.0,
) -> list[int | str]:
    """RESERVE's ARGV for this request, its budgets' after the rest."""
    return [
        tenant.rpm or 0,
        tenant.tpm or 0,
        tokens,
        tenant.max_concurrency or 0,
        request_id,
        STALE_HOLDER_S,
        tenant.key_rpm or 0,
        tenant.key_tpm or 0,
        tenant.key_max_concurrency or 0,
        *(quota_limit(tenant, p.kind) or 0 for p in periods),
        *(int(p.seconds_left(wall)) + COUNTER_GRACE_S for p in periods),
        repr(wall),  # a counter begun now counts the usage rows before this (counter_recovery.py)
        "1" if admitted else "0",
        *_budget_args(spend, cost, wall, alert_share),
    ]


def with_budget_keys(keys: LimitKeys, tenant_id: int, call_keys: list[str], names: Sequence[str]) -> list[str]:
    return [*call_keys, *budget_keys(keys, tenant_id, names)] if names else call_keys


def budget_keys(keys: LimitKeys, tenant_id: int, names: Sequence[str]) -> list[str]:
    """Each budget's counter, then each one's epoch hash (in the tenant's hash slot)."""
    return [*(keys.counter(tenant_id, n) for n in names), *(keys.epoch(tenant_id, n) for n in names)]


def _budget_args(spend: Sequence[Budget], cost: int, wall: float, alert_share: float) -> list[int | str]:
    if not spend:
        return []
    ttls = (int(b.period.seconds_left(wall)) + COUNTER_GRACE_S for b in spend)
    return [cost, len(spend), *(b.limit for b in spend), *ttls, round(alert_share * 1000)]


def settle_args(reservation: Reservation, used_cost: int) -> list[int | str]:
    if not reservation.budgets:
        return []
    unspent = max(0, reservation.cost - used_cost)
    return [unspent, used_cost, len(reservation.budgets), *reservation.budget_epochs]


def crossed(reply: list[Any], spend: Sequence[Budget]) -> list[tuple[Budget, int]]:
    """The budgets this reserve took past their soft threshold first in their period (reserve.lua
    marks each one's epoch hash), with what each has spent."""
    m = len(spend)
    if m == 0 or len(reply) <= FIRST_REPLY + 1 + m:
        return []
    bits = int(reply[FIRST_REPLY + 1 + m])
    spent = reply[FIRST_REPLY + 2 + m : FIRST_REPLY + 2 + 2 * m]
    return [(b, int(spent[j])) for j, b in enumerate(spend) if bits & (1 << j)]


def alert_crossed(alert: AlertHook | None, tenant: TenantSnapshot, reply: list[Any], spend: Sequence[Budget]) -> None:
    if alert is not None:
        for b, spent in crossed(reply, spend):
            alert(tenant, b, spent)


def reply_budgets(reply: list[Any], m: int) -> tuple[int, tuple[str, ...]]:
    """The budget counters still to be seeded (bit j-1: budget j) and each one's epoch."""
    if m == 0:
        return 0, ()
    epochs = tuple(e.decode() if isinstance(e, bytes) else str(e) for e in reply[FIRST_REPLY + 1 : FIRST_REPLY + 1 + m])
    return int(reply[FIRST_REPLY]), epochs
