"""A money budget past its soft threshold (core/budgets.py): counted in
laneway_budget_alerts_total, one log line, and a POST to LANEWAY_BUDGET_ALERT_WEBHOOK_URL when
set. The limiter says so once per budget and period (in Redis, once whichever replica saw it);
the webhook goes out from a background task, never on the request path: a bounded queue (what
does not fit is dropped and logged), one POST at a time, each with a timeout."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

from laneway.core.budgets import Budget
from laneway.core.prices import from_micros
from laneway.types import TenantSnapshot

log = logging.getLogger("laneway.budgets")
MAX_PENDING = 1000


class BudgetAlerts:
    def __init__(self, counter: Any, *, share: float, webhook_url: str | None, timeout_s: float, currency: str) -> None:
        self._counter = counter  # laneway_budget_alerts_total{owner,period}
        self.share = share
        self._url = webhook_url
        self._timeout = timeout_s
        self._currency = currency
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(MAX_PENDING)
        self._task: asyncio.Task[None] | None = None
        self.sent = 0
        self.failed = 0

    def __call__(self, tenant: TenantSnapshot, budget: Budget, spent: int) -> None:
        """The limiter's hook (on the event loop): never blocks, never raises."""
        kind = budget.period.kind
        self._counter.labels(budget.owner, kind).inc()
        whose = (
            f"tenant '{tenant.name}'" if budget.owner == "tenant" else f"API key {tenant.api_key_id} of '{tenant.name}'"
        )
        log.warning(
            "%s has spent %s of its %s budget of %s %s (%s): past %d %%",
            whose,
            from_micros(spent),
            kind,
            from_micros(budget.limit),
            self._currency,
            budget.period.name,
            round(self.share * 100),
        )
        key = tenant.api_key_id if budget.owner == "key" else None
        body = {
            "tenant": tenant.name,
            "tenant_id": tenant.id,
            "api_key_id": key,
            "period": budget.period.name,
            "spend": from_micros(spent),
            "budget": from_micros(budget.limit),
            "currency": self._currency,
            "threshold": self.share,
        }
        self.send(body)

    def send(self, body: dict[str, Any]) -> None:
        """Queue one alert for the webhook, when one is set (a canary's rollback goes out on
        this channel too: core/canary/watch.py). Never blocks, never raises."""
        if self._url is None:
            return
        try:
            self._queue.put_nowait(body)
        except asyncio.QueueFull:
            log.error("budget alert webhook: %d alerts waiting; this one is dropped: %s", MAX_PENDING, body)
            return
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._send(), name="budget-alerts")

    async def _send(self) -> None:
        assert self._url is not None
        async with httpx.AsyncClient(timeout=self._timeout) as client:
            while not self._queue.empty():
                body = self._queue.get_nowait()
                try:
                    response = await client.post(self._url, json=body)
                    response.raise_for_status()
                    self.sent += 1
                except httpx.HTTPError as exc:
                    self.failed += 1
                    log.error("budget alert webhook %s failed: %r (alert: %s)", self._url, exc, body)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
