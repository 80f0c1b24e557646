"""A tenant's usage in the admin UI: the page (figures and SVG charts for the last hour, day,
30 days or 12 months, its panel refreshed by htmx) and the CSV export of the raw rows, streamed.

The page sums the usage rollups (laneway.db.usage_stats over db/usage_series.py): its cost grows
with the buckets shown, never with the rows. The export reads the raw rows from a server-side
cursor at constant memory; rows past the raw retention are gone (their rollups remain).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any

from litestar import Controller, get
from litestar.di import NamedDependency
from litestar.params import FromPath
from litestar.response import Stream, Template
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from laneway.admin import service
from laneway.admin.charts import Chart, Series, lines, stacked_bars
from laneway.admin.guards import AdminRequest, NotLoggedIn
from laneway.admin.presentation import iso_utc
from laneway.admin.service import AdminService
from laneway.admin.ui import to_login
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.core.prices import from_micros
from laneway.db.models import Tenant
from laneway.db.usage_series import raw_gone_before
from laneway.db.usage_stats import (
    DEFAULT_PERIOD,
    EXPORT_COLUMNS,
    PERIODS,
    Period,
    UsageStatsRepository,
    UsageSummary,
    as_utc,
)

REFRESH_S = 10  # the panel's htmx poll; the figures are a few aggregate queries
CSV_CHUNK_ROWS = 1000
# A cell a spreadsheet would run as a formula (CSV injection): kept as text with a leading '.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_UNSAFE_FILENAME = re.compile(r"[^A-Za-z0-9._-]+")


def _period(raw: str | None) -> Period:
    period = PERIODS.get(raw or DEFAULT_PERIOD)
    if period is None:
        choices = ", ".join(PERIODS)
        raise GatewayError(ErrorCode.INVALID_REQUEST, f"period must be one of {choices}.", param="period")
    return period


def _axis_labels(summary: UsageSummary) -> list[str]:
    fmt = "%m-%d" if summary.period.width.days >= 1 else "%H:%M"
    return [as_utc(b.start).strftime(fmt) for b in summary.buckets]


def usage_charts(summary: UsageSummary) -> list[Chart]:
    labels = _axis_labels(summary)
    figures = [b.figures for b in summary.buckets]
    return [
        stacked_bars(
            "requests-chart",
            "Requests",
            labels,
            [
                Series("succeeded", "#4c7bd9", [f.requests - f.errors for f in figures]),
                Series("errors", "#c8423a", [f.errors for f in figures]),
            ],
        ),
        stacked_bars(
            "tokens-chart",
            "Tokens",
            labels,
            [
                Series("prompt", "#7a9cc6", [f.prompt_tokens for f in figures]),
                Series("completion", "#3c8d5a", [f.completion_tokens for f in figures]),
            ],
        ),
        lines(
            "ttft-chart",
            "Time to first token",
            labels,
            [
                Series("p50", "#4c7bd9", [f.ttft[0.5] for f in figures]),
                Series("p95", "#e0a030", [f.ttft[0.95] for f in figures]),
                Series("p99", "#c8423a", [f.ttft[0.99] for f in figures]),
            ],
            unit=" ms",
        ),
    ]


def csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        return as_utc(value).isoformat(timespec="microseconds").replace("+00:00", "Z")
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


async def csv_chunks(
    sessions: async_sessionmaker[AsyncSession], tenant_id: int, start: datetime, end: datetime
) -> AsyncIterator[bytes]:
    """The header, then one chunk per batch of rows from the cursor. The csv module quotes
    (RFC 4180: commas, quotes, line breaks); its own session, since a streamed body outlives
    the handler (and Litestar closes this generator if the client goes away)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")

    def take(rows: Sequence[Sequence[Any]]) -> bytes:
        buffer.seek(0)
        buffer.truncate()
        writer.writerows(rows)
        return buffer.getvalue().encode()

    yield take([EXPORT_COLUMNS])
    async with sessions() as session:
        async for part in UsageStatsRepository(session).stream_rows(tenant_id, start, end, chunk=CSV_CHUNK_ROWS):
            yield take([[csv_cell(v) for v in row] for row in part])


class UsagePages(Controller):
    """Behind the same guards as the other pages (admin/guards.py)."""

    path = "/admin/tenants"
    include_in_schema = False
    exception_handlers = {NotLoggedIn: to_login}

    async def _context(self, svc: AdminService, tenant_id: int, raw_period: str | None) -> dict[str, Any]:
        period = _period(raw_period)
        async with svc.sessions() as session:
            tenant = await service.get_or_404(session, Tenant, tenant_id)
            summary = await UsageStatsRepository(session).summary(tenant_id, period)
        return {
            "tenant": {"id": tenant.id, "name": tenant.name},
            "period": period,
            "periods": list(PERIODS.values()),
            "summary": summary,
            "totals": summary.totals,
            "charts": usage_charts(summary),
            "start": iso_utc(summary.start),
            "end": iso_utc(summary.end),
            "refresh_s": REFRESH_S,
            "money": lambda micros: f"{from_micros(micros)} {svc.currency}",
        }

    @get("/{tenant_id:int}/usage")
    async def usage(
        self, request: AdminRequest, admin_service: NamedDependency[AdminService], tenant_id: FromPath[int]
    ) -> Template:
        base = {"admin": request.user.username, "csrf": request.user.csrf}
        try:
            context = await self._context(admin_service, tenant_id, request.query_params.get("period"))
        except GatewayError as exc:
            if exc.status == 404:
                raise
            context = await self._context(admin_service, tenant_id, None)
            return Template("usage.html", context={**base, **context, "error": exc.message}, status_code=400)
        return Template("usage.html", context={**base, **context})

    @get("/{tenant_id:int}/usage/panel")
    async def panel(
        self, request: AdminRequest, admin_service: NamedDependency[AdminService], tenant_id: FromPath[int]
    ) -> Template:
        context = await self._context(admin_service, tenant_id, request.query_params.get("period"))
        return Template("usage_panel.html", context=context)

    @get("/{tenant_id:int}/usage.csv")
    async def export(
        self, request: AdminRequest, admin_service: NamedDependency[AdminService], tenant_id: FromPath[int]
    ) -> Stream:
        period = _period(request.query_params.get("period"))
        end = datetime.now(UTC)
        start = end - period.length
        async with admin_service.sessions() as session:
            tenant = await service.get_or_404(session, Tenant, tenant_id)
            gone_before = await raw_gone_before(session, tenant_id, start)
        name = _UNSAFE_FILENAME.sub("_", tenant.name).strip("._") or f"tenant-{tenant.id}"
        filename = f"usage-{name}-{period.key}-{end:%Y%m%dT%H%M%SZ}.csv"
        return Stream(
            csv_chunks(admin_service.sessions, tenant_id, start, end),
            media_type="text/csv; charset=utf-8",
            headers={
                "Content-Disposition": f'attachment; filename="{filename}"',
                "Cache-Control": "no-store",
                "X-Laneway-Usage-From": iso_utc(start),
                "X-Laneway-Usage-To": iso_utc(end),
                # Raw rows before this are past retention, dropped; the usage page's rollups keep them.
                **({"X-Laneway-Raw-Rows-Gone-Before": iso_utc(gone_before)} if gone_before else {}),
            },
        )
