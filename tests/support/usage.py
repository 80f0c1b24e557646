"""The usage rows a Gateway built in a unit test has queued, read off its UsageRecorder sink."""

from __future__ import annotations

from typing import Any

from laneway.core.pipeline import Gateway
from laneway.usage import UsageRecorder

from support.waiting import wait_for


def usage_record(i: int, key_id: int) -> dict[str, Any]:
    """A minimal usage row for tenant 1 (request id r{i}), as the recorder takes one."""
    return {
        "request_id": f"r{i}",
        "tenant_id": 1,
        "api_key_id": key_id,
        "model": "m",
        "endpoint": "chat",
        "stream": False,
        "status": 200,
        "prompt_tokens": 1,
        "completion_tokens": 1,
    }


def usage_rows(gateway: Gateway) -> list[dict[str, Any]]:
    recorder = next(s for s in gateway.sinks if isinstance(s, UsageRecorder))
    return recorder.queued_rows()


def written_rows(server: Any) -> list[Any]:
    """The usage rows a served gateway (an EmbeddedServer) has written, oldest first, after a
    flush; read on the server's own loop, so it works where this thread runs one (Playwright)."""
    from laneway.db.models import UsageRecord
    from sqlalchemy import select

    async def read() -> list[Any]:
        await server.runtime.recorder.flush()
        async with server.runtime.sessions() as s:
            return list((await s.execute(select(UsageRecord).order_by(UsageRecord.id))).scalars())

    return list(server.call(read()))


def row_of(gw: Any, request_id: str) -> Any:
    """The one usage row a served Gateway (support.servers.Gateway) wrote for request_id,
    waited for: the recorder writes it after the response has ended."""
    rows: list[Any] = []

    def written() -> bool:
        rows[:] = [r for r in gw.usage_rows() if r.request_id == request_id]
        return bool(rows)

    wait_for(written, within=10, step=0.05, what=f"usage row of {request_id}")
    assert len(rows) == 1, rows
    return rows[0]
