"""What the Files and Batches routes need from the runtime, as one dependency (`batch_api`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

from laneway.api.batches.validate import Limits
from laneway.api.batches.wire import BatchErrorData, BatchErrors, BatchObject, FileObject, RequestCounts, unix
from laneway.api.protocol import encode
from laneway.api.services import ApiServices
from laneway.contracts.errors import invalid_request
from laneway.db.batch_records import BatchInfo, FileInfo
from laneway.db.batch_store import BatchStore
from litestar import MediaType, Response
from litestar.di import NamedDependency
from litestar.params import SkipValidation


@dataclass(frozen=True, slots=True)
class BatchServices:
    store: BatchStore
    api: ApiServices
    limits: Limits
    window_s: float  # "24h", in seconds (shorter in tests)
    kick: Callable[[], None]  # tell this replica's runner there is work


BatchApi: TypeAlias = SkipValidation[NamedDependency[BatchServices]]


# NUL and the other control characters, and U+FFFD: what a byte that was not UTF-8 decodes to.
_NOT_TEXT = re.compile(r"[\x00-\x1f\x7f\ufffd]")


def text_param(param: str, value: str | None) -> str | None:
    """A path or query value of these routes (an id, a cursor, a purpose), checked before it
    reaches the database: PostgreSQL's text holds no NUL, so `?purpose=%00` was a 500 there.
    Ids and purposes are plain text; anything else is a 400 naming the parameter."""
    if value is not None and _NOT_TEXT.search(value):
        raise invalid_request(
            f"`{param}` must be plain text: no NUL or other control characters, and UTF-8 when percent-encoded.",
            param=param,
        )
    return value


def json_response(value: Any) -> Response[bytes]:
    return Response(encode(value), media_type=MediaType.JSON)


def cursor_page(items: list[Any], limit: int) -> dict[str, Any]:
    """OpenAI's list fields from `limit + 1` rows asked for: the page, its first and last ids
    (the `after` cursor) and whether more follow."""
    page = items[:limit]
    return {
        "data": page,
        "first_id": page[0].id if page else None,
        "last_id": page[-1].id if page else None,
        "has_more": len(items) > limit,
    }


def file_object(f: FileInfo) -> FileObject:
    return FileObject(
        id=f.id, bytes=f.bytes, created_at=int(f.created_at.timestamp()), filename=f.filename, purpose=f.purpose
    )


def batch_object(b: BatchInfo) -> BatchObject:
    errors = None
    if b.errors:
        errors = BatchErrors(
            data=[
                BatchErrorData(
                    code=str(e.get("code", "")),
                    message=str(e.get("message", "")),
                    param=e.get("param"),
                    line=e.get("line"),
                )
                for e in b.errors.get("data", ())
            ]
        )
    return BatchObject(
        id=b.id,
        endpoint=b.endpoint,
        errors=errors,
        input_file_id=b.input_file_id,
        completion_window=b.completion_window,
        status=b.status,  # type: ignore[arg-type]  # the store writes only the eight statuses
        output_file_id=b.output_file_id,
        error_file_id=b.error_file_id,
        created_at=int(b.created_at.timestamp()),
        in_progress_at=unix(b.in_progress_at),
        expires_at=unix(b.expires_at),
        finalizing_at=unix(b.finalizing_at),
        completed_at=unix(b.completed_at),
        failed_at=unix(b.failed_at),
        expired_at=unix(b.expired_at),
        cancelling_at=unix(b.cancelling_at),
        cancelled_at=unix(b.cancelled_at),
        request_counts=RequestCounts(total=b.total, completed=b.completed, failed=b.failed),
        metadata=b.metadata,
    )
