"""The usage API's page, modelled on OpenAI's organization usage API (GET
/v1/organization/usage/completions): `start_time` and `end_time` (Unix seconds), `bucket_width`
1m, 1h or 1d, `group_by` (model, key, lane; repeated or comma-separated), `limit` buckets a
page and `page` (the previous page's `next_page`). Every bucket of the window is listed, empty
ones with no results, as OpenAI does. Read from the rollups (db/usage_series.py): a page costs
its buckets, never the raw rows. A bad parameter is a 400 naming it.

The admin API serves it for any tenant (`tenant_id`, or none: all); a tenant's own surface
can serve the same shape with its tenant fixed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.db.usage_series import usage_series

# bucket_width -> (seconds, default buckets a page, most buckets a page): OpenAI's defaults.
WIDTHS = {"1m": (60, 60, 1440), "1h": (3600, 24, 168), "1d": (86400, 7, 31)}
# group_by names -> the result's field; OpenAI spells the key api_key_id.
GROUPS = {"model": "model", "key": "api_key_id", "api_key_id": "api_key_id", "lane": "lane"}
_PAGE_PREFIX = "page_"
_MAX_TIME = 2**37  # year 6325: a number that large is a mistake, not a date


@dataclass(frozen=True)
class UsageQuery:
    start_s: int  # aligned down to the bucket width
    end_s: int
    width: str
    group_by: tuple[str, ...]  # GROUPS keys, normalised ("api_key_id" -> "key")
    limit: int
    page_s: int  # this page's first bucket


def _bad(param: str, message: str) -> GatewayError:
    return GatewayError(ErrorCode.INVALID_REQUEST, message, param=param)


def _time(param: str, raw: str | None) -> int | None:
    if raw is None or raw == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise _bad(param, f"{param} must be a Unix time in whole seconds.") from None
    if not 0 <= value <= _MAX_TIME:
        raise _bad(param, f"{param} must be a Unix time in whole seconds (0 or more).")
    return value


def parse_query(params: dict[str, list[str]], *, now: datetime | None = None, tenant_param: bool = True) -> UsageQuery:
    """The query from the request's parameters (each name -> its values, in order)."""

    def one(name: str) -> str | None:
        values = params.get(name) or []
        if len(values) > 1:
            raise _bad(name, f"{name} may be given once.")
        return values[0] if values else None

    known = {
        "start_time",
        "end_time",
        "bucket_width",
        "group_by",
        "limit",
        "page",
        *(("tenant_id",) if tenant_param else ()),
    }
    for name in params:
        if name not in known:
            raise _bad(name, f"unknown parameter {name}; the usage API takes {', '.join(sorted(known))}.")
    width = one("bucket_width") or "1d"
    if width not in WIDTHS:
        raise _bad("bucket_width", "bucket_width must be one of 1m, 1h, 1d.")
    seconds, default_limit, max_limit = WIDTHS[width]
    start = _time("start_time", one("start_time"))
    if start is None:
        raise _bad("start_time", "start_time is required (Unix seconds).")
    end = _time("end_time", one("end_time"))
    if end is None:
        end = int((now or datetime.now(UTC)).timestamp()) + 1
    if end <= start:
        raise _bad("end_time", "end_time must be after start_time.")
    groups: list[str] = []
    for raw in params.get("group_by") or []:
        for name in (part.strip() for part in raw.split(",")):
            if name not in GROUPS:
                raise _bad("group_by", f"group_by {name!r} is not one of model, key (api_key_id), lane.")
            name = "key" if name == "api_key_id" else name
            if name not in groups:
                groups.append(name)
    raw_limit = one("limit")
    limit = default_limit
    if raw_limit is not None:
        try:
            limit = int(raw_limit.strip())
        except ValueError:
            raise _bad("limit", f"limit must be a whole number from 1 to {max_limit}.") from None
        if not 1 <= limit <= max_limit:
            raise _bad("limit", f"limit must be from 1 to {max_limit} for bucket_width {width}.")
    aligned = start - start % seconds
    page_s = aligned
    raw_page = one("page")
    if raw_page is not None:
        token = raw_page.removeprefix(_PAGE_PREFIX)
        if not raw_page.startswith(_PAGE_PREFIX) or not token.isdigit():
            raise _bad("page", "page must be a next_page value from a previous answer.")
        page_s = int(token)
        if page_s < aligned or page_s >= end or (page_s - aligned) % seconds:
            raise _bad("page", "page does not belong to this start_time, end_time and bucket_width.")
    return UsageQuery(aligned, end, width, tuple(groups), limit, page_s)


def tenant_of(params: dict[str, list[str]]) -> int | None:
    values = params.get("tenant_id") or []
    if not values:
        return None
    raw = values[-1].strip()
    if not raw.isdigit() or not 0 < int(raw) < 2**31:
        raise _bad("tenant_id", "tenant_id must be a tenant's id (a positive whole number).")
    return int(raw)


def _result(tenant_id: int | None, group: dict[str, Any], totals: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "object": "usage.result",
        "tenant_id": tenant_id,
        "num_model_requests": totals.requests,
        "num_errors": totals.errors,
        "input_tokens": totals.prompt_tokens,
        "output_tokens": totals.completion_tokens,
        "cost_micros": totals.cost_micros,
        "ttft_ms": {"p50": totals.ttft(0.5), "p95": totals.ttft(0.95), "p99": totals.ttft(0.99)},
    }
    for name in ("model", "key", "lane"):
        out[GROUPS[name]] = group.get(name)
    return out


async def usage_page(session: AsyncSession, tenant_id: int | None, query: UsageQuery) -> dict[str, Any]:
    """One page: `limit` buckets from query.page_s, each with its results per group."""
    seconds = WIDTHS[query.width][0]
    page_end = min(query.end_s, query.page_s + query.limit * seconds)
    start = datetime.fromtimestamp(query.page_s, UTC)
    rows = await usage_series(
        session, tenant_id, start, datetime.fromtimestamp(page_end, UTC), timedelta(seconds=seconds), query.group_by
    )
    by_start: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_start.setdefault(int(row.start.timestamp()), []).append(_result(tenant_id, row.group, row.totals))
    data = [
        {"object": "bucket", "start_time": at, "end_time": at + seconds, "results": by_start.get(at, [])}
        for at in range(query.page_s, page_end, seconds)
    ]
    more = page_end < query.end_s
    return {
        "object": "page",
        "data": data,
        "has_more": more,
        "next_page": f"{_PAGE_PREFIX}{page_end}" if more else None,
    }


def query_params(items: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, value in items:
        out.setdefault(name, []).append(value)
    return out
